"""``vfioctl sriov`` (list SR-IOV PFs) and ``vfioctl sriov set`` (change a VF count by hand).

Thin: calls :class:`vfio_dp.host.sriov.Sriov` and prints. ``-o json`` gives one object per
PF::

    {"address": "0000:01:00.0", "driver": "nvme", "totalvfs": 2, "numvfs": 2, "wanted": 2,
     "autoprobe": 0, "vfs": ["0000:01:00.1", "0000:01:00.2"], "made_by": "daemon:devicePlugin",
     "before": 0, "held": {"0000:01:00.1": ["/dev/vfio/12 is held open by pid 812 (qemu)"]},
     "why_not": [], "interrupted": null}

``wanted`` is what ``--config``'s ``numVfs`` asks (null: nothing); ``why_not`` says why the
count is not what is wanted (the refusals a change would meet now).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from cli.common import (
    fail,
    option,
    output_option,
    print_json,
    print_table,
    root_option,
    run_guarded,
    say,
)

if TYPE_CHECKING:
    from vfio_dp.host.sriov import Held, PfView, Sriov
    from vfio_dp.model.address import PciAddress

F = TypeVar("F", bound=Callable[..., Any])


def _sriov(root: str) -> Sriov:
    from vfio_dp.host import Host
    from vfio_dp.host.sriov import Sriov

    return Sriov(Host(root))


def _holds(sriov: Sriov, pod_resources_socket: str) -> Held:
    """Who else holds a VF: the DRA plugin's prepared claims (its checkpoints) and the
    devices the kubelet gave running pods (its PodResources API, when it is there)."""
    from vfio_dp.deviceplugin.podresources import holds
    from vfio_dp.dra.claimpath.holds import checkpoint_holds

    out: dict[PciAddress | str, list[str]] = {}
    for found in (checkpoint_holds(sriov.host.fs), holds(pod_resources_socket)):
        for a, who in found.items():
            out.setdefault(a, []).extend(who)
    return out


def _inherited(ctx: click.Context, name: str, value: Any) -> Any:
    """``value`` of this subcommand's option ``name``, or the one given to ``vfioctl sriov``
    itself when only that was given (``vfioctl sriov --root T set ...`` acts under T)."""
    from click.core import ParameterSource

    parent = ctx.parent
    if parent is None or ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
        return value
    return parent.params.get(name, value)


def pod_resources_option(f: F) -> F:
    return option(
        "--pod-resources-socket",
        default="/var/lib/kubelet/pod-resources/kubelet.sock",
        show_default=True,
        type=click.Path(dir_okay=False),
        help="The kubelet's PodResources API (never joined with --root): a VF a running pod "
        "was given is held. No socket: no pods to ask about.",
    )(f)


def _pf_json(v: PfView, want: int | None) -> dict[str, object]:
    return {
        "address": str(v.pf.address),
        "ids": f"{v.pf.vendor}:{v.pf.device}",
        "driver": v.pf.driver,
        "totalvfs": v.pf.totalvfs,
        "numvfs": v.pf.numvfs,
        "wanted": want,
        "autoprobe": v.pf.autoprobe,
        "vfs": [str(a) for a in v.pf.vfs],
        "made_by": v.record.by if v.record else None,
        "before": v.record.before if v.record else None,
        "held": {str(a): who for a, who in v.held.items()},
        "why_not": v.why_not(want),
        "interrupted": v.interrupted.describe() if v.interrupted else None,
    }


@click.group("sriov", invoke_without_command=True)
@root_option
@output_option
@option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Node config (YAML): the VF count its numVfs selectors ask of each PF (WANTED).",
)
@pod_resources_option
@click.pass_context
def sriov(
    ctx: click.Context, root: str, output: str, config: str | None, pod_resources_socket: str
) -> None:
    """SR-IOV PFs: VF counts (total, now, wanted by the config), who made them, which VFs
    are held and by whom, and why a count is not what the config wants."""
    if ctx.invoked_subcommand is not None:
        return

    def body() -> int:
        from vfio_dp.host.files import load_config

        wanted = {pf: n for pf, (n, _) in load_config(config).wanted_vfs().items()}
        s = _sriov(root)
        views = [(v, wanted.get(v.pf.address)) for v in s.view(_holds(s, pod_resources_socket))]
        rows = [_pf_json(v, want) for v, want in views]
        if output == "json":
            print_json(rows)
            return 0
        print_table(
            ["address", "ids", "driver", "total", "numvfs", "wanted", "made by", "held", "why not"],
            [
                (
                    str(v.pf.address),
                    f"{v.pf.vendor}:{v.pf.device}",
                    v.pf.driver,
                    v.pf.totalvfs,
                    v.pf.numvfs,
                    want,
                    v.record.by if v.record else None,
                    "; ".join(f"{a}: {', '.join(w)}" for a, w in v.held.items()) or None,
                    " | ".join(v.why_not(want)) or None,
                )
                for v, want in views
            ],
        )
        for r in rows:
            if r["interrupted"]:
                say(
                    f"vfioctl: INTERRUPTED {r['interrupted']}: vfioctl unbind --all puts it back",
                    err=True,
                )
        return 0

    run_guarded(body)


@sriov.command("set")
@click.argument("address")
@click.argument("count", type=int)
@root_option
@output_option
@option("--force", is_flag=True, help="Change a PF whose VFs vfio_dp did not make.")
@option("--dry-run", is_flag=True, help="Print the exact sysfs writes, change nothing.")
@option("--bind/--no-bind", default=True, show_default=True, help="Bind the made VFs to vfio-pci.")
@pod_resources_option
@click.pass_context
def set_cmd(
    ctx: click.Context,
    address: str,
    count: int,
    root: str,
    output: str,
    force: bool,
    dry_run: bool,
    bind: bool,
    pod_resources_socket: str,
) -> None:
    """Set the PF at ADDRESS to COUNT VFs, by the kernel's rules (through 0; at most
    sriov_totalvfs; autoprobe off while VFs exist). Refused while any VF is held. Exits 1
    when the VFs exist but could not be bound (the reason is printed)."""
    root = _inherited(ctx, "root", root)
    output = _inherited(ctx, "output", output)
    pod_resources_socket = _inherited(ctx, "pod_resources_socket", pod_resources_socket)

    def body() -> int:
        from vfio_dp.model.address import parse_given

        if count < 0:
            fail(f"COUNT {count} is not a VF count: give 0 or more", 2)
        s = _sriov(root)
        res = s.set(
            parse_given(address),
            count,
            force=force,
            dry_run=dry_run,
            bind=bind,
            extra=_holds(s, pod_resources_socket),
        )
        if output == "json":
            print_json(
                {
                    "address": str(res.pf),
                    "count": res.target,
                    "dry_run": res.dry_run,
                    "already": res.already,
                    "steps": res.steps,
                    "made": [str(a) for a in res.made],
                    "destroyed": [str(a) for a in res.destroyed],
                    "bound": [str(a) for a in res.bound],
                    "warnings": res.warnings,
                    "error": res.bind_error,
                }
            )
            return 1 if res.bind_error else 0
        for w in res.warnings:
            say(f"warning: {w}", err=True)
        if res.dry_run:
            for step in res.steps:
                say(step)
            return 0
        say(f"{res.pf}: {'already ' if res.already else ''}{res.target} VFs")
        for a in res.made:
            say(f"  made {a} ({'vfio-pci' if a in res.bound else 'no driver'})")
        for a in (a for a in res.bound if a not in res.made):
            say(f"  bound {a} (vfio-pci)")
        if res.bind_error:
            say(f"vfioctl: {res.bind_error}", err=True)
            return 1
        return 0

    run_guarded(body)
