"""``kubectl vfio``: every node from one command (a kubectl plugin, installed as ``kubectl-vfio``).

    kubectl vfio --node worker-3 list              # vfioctl list in worker-3's DaemonSet pod
    kubectl vfio --all-nodes groups -o json        # every node's groups, each with "node"
    kubectl vfio status                            # per node, from the API objects, no exec
    kubectl vfio held --wait 600                   # exit 0 once no node holds a device open

Like ``kubectl exec daemonset/…`` but never one arbitrary pod: ``--node`` names the node,
``--all-nodes`` runs on each and merges (a ``NODE`` column; ``"node"`` in JSON). Only read
commands run (``list``, ``groups``, ``check``, ``sriov``). The client shell is
:mod:`vm_translate.cluster`; merging and the summary are pure (:mod:`vm_translate.fleet`).
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import click

from cli.common import fail, run_guarded

if TYPE_CHECKING:
    from vm_translate.cluster import Cluster

EXIT_HELD = 1


def _cluster(ctx: click.Context) -> Cluster:
    from vm_translate.cluster import Cluster

    o = ctx.obj
    return Cluster(
        o["kubeconfig"],
        o["context"],
        o["namespace"],
        request_timeout=o["request_timeout"],
        exec_timeout=o["timeout"],
    )


@click.group(
    "kubectl-vfio",
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"], "allow_interspersed_args": False},
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False),
    help="As kubectl's (else $KUBECONFIG, ~/.kube/config).",
)
@click.option("--context", help="The kubeconfig context to use.")
@click.option(
    "-n", "--namespace", default="vfio-dp", show_default=True, help="Namespace of our DaemonSets."
)
@click.option("--node", help="Run COMMAND in this node's DaemonSet pod.")
@click.option("--all-nodes", is_flag=True, help="Run COMMAND on every node and merge the outputs.")
@click.option(
    "--timeout",
    default=120.0,
    show_default=True,
    type=click.FloatRange(1, 3600),
    help="Seconds one command may run on a node.",
)
@click.option(
    "--request-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.5, 600),
    help="Seconds one API call (or an exec's WebSocket handshake) may take.",
)
@click.version_option(package_name="vfio-dp", prog_name="kubectl-vfio")
@click.pass_context
def kubectl_vfio(
    ctx: click.Context,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    node: str | None,
    all_nodes: bool,
    timeout: float,
    request_timeout: float,
) -> None:
    """vfio-dp on every node: a vfioctl read command on one node (--node) or all
    (--all-nodes), or `status` / `held` for the whole cluster.

    \b
    kubectl vfio --node NODE COMMAND [ARGS]...   COMMAND: list, groups, check, sriov
    kubectl vfio --all-nodes COMMAND [ARGS]...
    kubectl vfio status [-o json]
    kubectl vfio held [--wait SECONDS]
    """  # fmt: skip
    ctx.obj = {
        "kubeconfig": kubeconfig,
        "context": context,
        "namespace": namespace,
        "node": node,
        "all_nodes": all_nodes,
        "timeout": timeout,
        "request_timeout": request_timeout,
    }
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@kubectl_vfio.command(
    "run",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_cmd(ctx: click.Context, args: tuple[str, ...]) -> None:
    """A vfioctl read command on --node or --all-nodes (what `kubectl vfio list` becomes)."""
    o = ctx.obj

    def body() -> int:
        from vm_translate import fleet

        command = fleet.read_command(args)
        if bool(o["node"]) == bool(o["all_nodes"]):
            fail("name one node (--node NODE) or every node (--all-nodes)", 2)
        cluster = _cluster(ctx)
        pods = cluster.pods(o["node"])
        if not pods:
            where = f"on node {o['node']}" if o["node"] else "on any node"
            fail(f"no running vfio-dp DaemonSet pod {where} in namespace {o['namespace']}", 1)
        results = [cluster.exec(p, command) for p in pods]
        for r in results:
            if r.stderr.strip():
                for line in r.stderr.rstrip().splitlines():
                    click.echo(f"{r.node}: {line}", err=True)
        outputs = [(r.node, r.stdout) for r in results]
        if o["node"]:
            click.echo(results[0].stdout, nl=False)
        elif fleet.wants_json(args):
            click.echo(json.dumps(fleet.merge_json(outputs), indent=2))
        else:
            click.echo(fleet.merge_tables(outputs), nl=False)
        return max(r.returncode for r in results)

    run_guarded(body)


@kubectl_vfio.command("status")
@click.option(
    "-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.option(
    "--domain",
    default="devices.kubevirt.io",
    show_default=True,
    help="The device plugin's resource domain.",
)
@click.option(
    "--driver", default="vfio.dra.vfio-dp.io", show_default=True, help="The DRA driver name."
)
@click.pass_context
def status_cmd(ctx: click.Context, output: str, domain: str, driver: str) -> None:
    """Per node: our pods, device-plugin devices, DRA devices published, allocated and tainted
    (from the API objects; no exec)."""

    def body() -> int:
        from vm_translate import fleet

        nodes, pods, slices, claims = _cluster(ctx).objects()
        rows = fleet.node_status(nodes, pods, slices, claims, domain=domain, driver=driver)
        if output == "json":
            click.echo(json.dumps([r.as_json() for r in rows], indent=2))
        else:
            click.echo(fleet.status_table(rows), nl=False)
        return 0

    run_guarded(body)


@kubectl_vfio.command("held")
@click.option(
    "--wait",
    "wait_s",
    default=0.0,
    type=click.FloatRange(0, 86400),
    help="Ask again every 5 s for up to this many seconds until nothing is held.",
)
@click.pass_context
def held_cmd(ctx: click.Context, wait_s: float) -> None:
    """Every IOMMU group a process holds open, on every node (vfioctl groups there).

    Exit 0 when none is held, 1 while any is (uninstall waits on this)."""

    def body() -> int:
        from vm_translate import fleet

        cluster = _cluster(ctx)
        deadline = time.monotonic() + wait_s
        while True:
            pods = cluster.pods(None)
            held = []
            for p in pods:
                r = cluster.exec(p, ["vfioctl", "groups", "-o", "json"])
                if r.returncode:
                    fail(
                        f"node {r.node}: vfioctl groups exited {r.returncode}: {r.stderr.strip()[:500]}",
                        1,
                    )
                held.extend(fleet.held_groups(r.node, r.stdout))
            if not held or time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        for h in held:
            click.echo(f"{h['node']}: group {h['group']} ({' '.join(h['devices'])}) is held open")
        if not held:
            click.echo(f"nothing held on {len(pods)} node(s)")
        return EXIT_HELD if held else 0

    run_guarded(body)


def main() -> None:
    """The ``kubectl-vfio`` entry point: `kubectl vfio [FLAGS] list …` runs as `run list …`."""
    argv = sys.argv[1:]
    valued = {  # the group's own options that take a value, read from the group itself
        o
        for p in kubectl_vfio.params
        if isinstance(p, click.Option) and not p.is_flag and not p.count
        for o in p.opts
    }
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in valued else 1
    if i < len(argv) and argv[i] not in kubectl_vfio.commands:
        argv = [*argv[:i], "run", *argv[i:]]
    kubectl_vfio.main(args=argv, prog_name="kubectl vfio")
