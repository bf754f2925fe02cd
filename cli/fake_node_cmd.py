"""``vfioctl fake-node DIR --profile P``: a realistic fake node to try vfio-dp without hardware.

Thin: refuses a directory that is not empty, builds the profile's tree
(:mod:`vfio_dp.host.fake_profiles`) and says what to run against it.
"""

from __future__ import annotations

import click

from cli.common import option, run_guarded, say
from vfio_dp.host.fake_profiles import PROFILES, TRY_BIND


@click.command("fake-node")
@click.argument("directory", type=click.Path(file_okay=False))
@option(
    "--profile",
    type=click.Choice(sorted(PROFILES)),
    default="gpu-host",
    show_default=True,
    help="gpu-host: a GPU + audio group, NICs, an SR-IOV PF, the host's own devices; "
    "nic-host: NICs to hand out (one dual-port group); sriov-host: PFs with VFs.",
)
def fake_node(directory: str, profile: str) -> None:
    """Build a fake node (sys/, dev/, proc/ of a realistic host) in DIRECTORY for --root.

    A fake node does not react to writes: no kernel is behind it, so no driver ever moves. A
    `vfioctl bind` there writes its files, reads the device back, finds it not on vfio-pci,
    puts back what it wrote and fails saying so; use `bind --dry-run` to see the writes.
    """

    def body() -> int:
        import os

        from vfio_dp.errors import UsageError

        if os.path.lexists(directory) and (
            not os.path.isdir(directory) or os.path.islink(directory) or os.listdir(directory)
        ):
            raise UsageError(
                f"{directory} exists and is not an empty directory: give a new or empty one "
                "(a fake node is written into it)"
            )
        tree = PROFILES[profile](os.path.abspath(directory))  # type: ignore[arg-type]
        groups = {d.group for d in tree.devs.values() if d.group is not None}
        say(
            f"fake node {profile} in {tree.root}: {len(tree.devs)} PCI functions, "
            f"{len(groups)} IOMMU groups. It does not react to writes (bind --dry-run shows "
            "what a bind would write). Try:"
        )
        root = f"--root {tree.root}"
        for line in (
            f"vfioctl list {root}",
            f"vfioctl groups {root} --no-probe",
            f"vfioctl check {root} $(vfioctl list {root} -o name --driver vfio-pci)",
            f"vfioctl check {root} {TRY_BIND[profile]}",
            f"vfioctl bind --dry-run --group {root} pci/{TRY_BIND[profile]}",
        ):
            say(f"  {line}")
        return 0

    run_guarded(body)
