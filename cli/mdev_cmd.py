"""``vfioctl mdev``: mediated-device parents, their types and instances (read-only).

Thin: :func:`vfio_dp.host.mdev.read_mdevs` reads; this prints. ``-o json`` gives one object
per parent::

    {"parent": "mtty", "address": null, "driver": "mtty",
     "types": [{"type": "mtty-2", "name": "Dual port serial", "available": 11,
                "deviceApi": "vfio-pci", "description": "…"}],
     "instances": [{"uuid": "83b8f4f2-…", "type": "mtty-2", "iommuGroup": 7,
                    "vfioNode": "/dev/vfio/7", "driver": "vfio_mdev"}]}

The table has one row per type with its instances; ``-o wide`` adds each instance's IOMMU
group; ``-o name`` prints ``mdev/<uuid>`` per instance. Problems met while reading (a parent
that vanished, an instance of a type its parent does not list) go to stderr.
"""

from __future__ import annotations

import click

from cli.common import output_option, print_json, print_names, print_table, root_option, run_guarded


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
        from vfio_dp.host.root import Root

        inv = read_mdevs(Root(root))
        for problem in inv.problems:
            click.echo(f"vfioctl: {problem}", err=True)
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
                             "vfioNode": i.vfio_node, "driver": i.driver}
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
