"""``vfioctl mdev``: mediated-device parents, their types and instances; ``create``, ``remove``.

Thin: :func:`vfio_dp.host.mdev.read_mdevs` reads; this prints. ``-o json`` gives one object
per parent::

    {"parent": "mtty", "address": null, "driver": "mtty",
     "types": [{"type": "mtty-2", "name": "Dual port serial", "available": 11,
                "deviceApi": "vfio-pci", "description": "…"}],
     "instances": [{"uuid": "83b8f4f2-…", "type": "mtty-2", "iommuGroup": 7,
                    "vfioNode": "/dev/vfio/7", "driver": "vfio_mdev", "madeBy": "operator"}]}

The table has one row per type with its instances; ``-o wide`` adds each instance's IOMMU
group; ``-o name`` prints ``mdev/<uuid>`` per instance. Problems met while reading (a parent
that vanished, an instance of a type its parent does not list), recorded instances that are
gone and interrupted operations go to stderr. ``madeBy`` is who made the instance by its
record (``operator``, ``device-plugin``, ``dra-plugin``, ``claim:<uid>``; null: not vfio_dp).

``vfioctl mdev create PARENT TYPE`` and ``vfioctl mdev remove UUID…`` make and remove
instances through :class:`vfio_dp.host.mdev_ops.Mdevs` (journalled; ``--dry-run`` prints the
exact writes)::

    echo <uuid> > /sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/create
    echo 1 > /sys/bus/mdev/devices/<uuid>/remove
"""

from __future__ import annotations

import click

from cli.common import (
    fail,
    option,
    output_option,
    print_json,
    print_names,
    print_table,
    root_option,
    run_guarded,
    say,
)
from cli.sriov_cmd import _inherited, pod_resources_option


@click.group("mdev", invoke_without_command=True)
@root_option
@output_option
@click.pass_context
def mdev(ctx: click.Context, root: str, output: str) -> None:
    """Mediated devices (vGPU-style slices): each parent's types (name, instances available,
    device API) and the instances made of them, with their IOMMU group and VFIO node."""
    if ctx.invoked_subcommand is not None:
        return

    def body() -> int:
        from vfio_dp.host.mdev import read_mdevs
        from vfio_dp.host.mdev_store import MdevStore
        from vfio_dp.host.root import Root

        fs = Root(root)
        inv = read_mdevs(fs)
        store = MdevStore(fs)
        records, bad = store.records()
        made_by = {r.uuid: r.by for r in records}
        present = {i.uuid for i in inv.instances}
        for problem in [*inv.problems, *bad]:
            click.echo(f"vfioctl: {problem}", err=True)
        for r in records:
            if r.uuid not in present:
                click.echo(f"vfioctl: mdev {r.uuid} ({r.type_id} on {r.parent}, made by {r.by}) "
                           "is recorded but gone: its maker makes it again, or vfioctl mdev "
                           "remove drops the record", err=True)  # fmt: skip
        for u in store.journaled():
            click.echo(f"vfioctl: INTERRUPTED mdev operation on {u}: the next vfioctl mdev "
                       "create/remove on its parent finishes or undoes it", err=True)  # fmt: skip
        if output in ("json", "yaml"):
            print_json(
                [
                    {
                        "parent": p.name,
                        "address": str(p.address) if p.address else None,
                        "driver": p.driver,
                        "types": [
                            {"type": t.type_id, "name": t.name, "available": t.available,
                             "deviceApi": t.device_api, "description": t.description}
                            for t in p.types
                        ],
                        "instances": [
                            {"uuid": i.uuid, "type": i.type_id, "iommuGroup": i.iommu_group,
                             "vfioNode": i.vfio_node, "driver": i.driver,
                             "madeBy": made_by.get(i.uuid)}
                            for i in p.instances
                        ],
                    }
                    for p in inv.parents
                ],
                output,
            )  # fmt: skip
            return 0
        if output == "name":
            print_names([f"mdev/{i.uuid}" for i in inv.instances])
            return 0
        wide = output == "wide"
        rows: list[tuple[object, ...]] = []
        for p in inv.parents:
            for t in p.types or ():
                mine = [i for i in p.instances if i.type_id == t.type_id]
                shown = [f"{i.uuid}(group {i.iommu_group})" if wide else i.uuid for i in mine]
                rows.append(
                    (p.name, p.driver, t.type_id, t.name, t.available, t.device_api,
                     " ".join(shown) or None)
                )  # fmt: skip
            for i in p.instances:
                if i.type_id is None:  # an instance of a type its parent does not list
                    rows.append((p.name, p.driver, None, None, None, None, i.uuid))
        print_table(
            ["parent", "driver", "type", "name", "available", "api", "instances"], rows, wide=wide
        )
        return 0

    run_guarded(body)


def _holds(pod_resources_socket: str) -> dict[str, list[str]]:
    """Who else holds an instance: the devices (by UUID) the kubelet gave running pods (its
    PodResources API, when it is there; no answer holds every instance)."""
    from vfio_dp.deviceplugin.podresources import PodResourcesError, allocated
    from vfio_dp.model.mdev import is_uuid

    try:
        found = allocated(pod_resources_socket)
    except FileNotFoundError:
        return {}
    except PodResourcesError as e:
        return {"*": [str(e)]}
    return {k: who for k, who in found.items() if is_uuid(k)}


def _report(res: object, output: str, verb: str) -> int:
    from vfio_dp.host.mdev_ops import MdevResult

    assert isinstance(res, MdevResult)
    if output in ("json", "yaml"):
        print_json(
            {"uuids": res.uuids, "dryRun": res.dry_run, "steps": res.steps,
             "warnings": res.warnings},
            output,
        )  # fmt: skip
        return 0
    for w in res.warnings:
        say(f"warning: {w}", err=True)
    if res.dry_run:
        for step in res.steps:
            say(step)
        return 0
    for u in res.uuids:
        say(f"mdev/{u} {verb}")
    return 0


@mdev.command("create")
@click.argument("parent")
@click.argument("type_id", metavar="TYPE")
@root_option
@output_option
@option("--uuid", "uuids", multiple=True, help="The instance's UUID (repeat for several); "
        "default: new random ones.")  # fmt: skip
@option("--count", type=int, default=None, help="How many instances to make (default 1).")
@option("--dry-run", is_flag=True, help="Print the exact sysfs writes, change nothing.")
@click.pass_context
def create_cmd(
    ctx: click.Context,
    parent: str,
    type_id: str,
    root: str,
    output: str,
    uuids: tuple[str, ...],
    count: int | None,
    dry_run: bool,
) -> None:
    """Make instances of TYPE on PARENT (a name from `vfioctl mdev`, e.g. mtty, or a PCI
    address), recorded as the operator's: they are made again with the same UUIDs by
    `vfioctl mdev create` after a reboot only if asked; a node process's config re-makes its
    own. Refused (nothing made) for an unknown parent or type, a bad or taken UUID, or too
    few available_instances."""
    root = _inherited(ctx, "root", root)
    output = _inherited(ctx, "output", output)

    def body() -> int:
        import uuid as uuidlib

        from vfio_dp.host import Host
        from vfio_dp.host.mdev_ops import Mdevs

        n = count if count is not None else max(len(uuids), 1)
        if n < 1:
            fail(f"--count {n} makes nothing: give 1 or more", 2)
        if uuids and len(uuids) != n:
            fail(f"--count {n} with {len(uuids)} --uuid: give one --uuid per instance, "
                 "or no --uuid", 2)  # fmt: skip
        given = [u.lower() for u in uuids] or [str(uuidlib.uuid4()) for _ in range(n)]
        res = Mdevs(Host(root)).create(parent, type_id, given, dry_run=dry_run)
        return _report(res, output, "created")

    run_guarded(body)


@mdev.command("remove")
@click.argument("uuids", metavar="UUID...", nargs=-1, required=True)
@root_option
@output_option
@option("--force", is_flag=True, help="Also remove instances vfio_dp did not make, or that "
        "a node process's config made (never a held one).")  # fmt: skip
@option("--dry-run", is_flag=True, help="Print the exact sysfs writes, change nothing.")
@pod_resources_option
@click.pass_context
def remove_cmd(
    ctx: click.Context,
    uuids: tuple[str, ...],
    root: str,
    output: str,
    force: bool,
    dry_run: bool,
    pod_resources_socket: str,
) -> None:
    """Remove the instances UUID... Refused (nothing removed) while one is held: its
    /dev/vfio/<N> open, a DRA claim's, or a running pod's (the kubelet's PodResources API);
    and, without --force, for one vfio_dp did not make or a node process's config made."""
    root = _inherited(ctx, "root", root)
    output = _inherited(ctx, "output", output)

    def body() -> int:
        from vfio_dp.host import Host
        from vfio_dp.host.mdev_ops import Mdevs

        res = Mdevs(Host(root)).remove(
            [u.lower() for u in uuids], force=force, dry_run=dry_run,
            extra=_holds(pod_resources_socket),
        )  # fmt: skip
        return _report(res, output, "removed")

    run_guarded(body)
