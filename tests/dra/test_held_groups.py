"""The DRA plugin never publishes a group a process outside our claims holds open — a VM the
device plugin started before the node moved to DRA — and publishes it once it is closed.

The real plugin publishes to the API-server stand-in on a temp sysfs tree whose ``proc/``
holds a process with ``/dev/vfio/<N>`` open (real symlinks, as /proc shows them).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.dra.apiserver_standin import ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.test_dra_plugin import DRIVER, pool, until
from tests.dra.topologies import DRA_CONFIG, PUBLISHED, dra_host
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host
from vfio_dp.model.serving import DraUnit, withdraw_held


def hold(root: Path, pid: int, node: str) -> Path:
    d = root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text("qemu-kvm\n")
    (d / "fd" / "31").symlink_to(node)
    return d


async def test_a_group_held_outside_our_claims_is_withdrawn_until_closed(
    tmp_path: Path, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    tree = dra_host(tmp_path / "host")
    config = tmp_path / "c.yaml"
    config.write_text(DRA_CONFIG)
    # the mlx VF in group 61 is on vfio-pci: a VM started by the device plugin holds it
    holder = hold(tree.root, 4242, "/dev/vfio/61")
    registry, plugins = kdirs
    plugin = DraPlugin(
        DraOptions(
            node_name=NODE, driver_name=DRIVER, registry_dir=registry, plugins_dir=plugins,
            config_path=str(config), root=str(tree.root), resync=0.2, metrics_port=0,
            uevents=False,
        ),
        apiserver.client(),
        host=Host(tree.root),
    )  # fmt: skip
    await plugin.start()
    try:
        expected = set(PUBLISHED) - {"pci-0000-af-00-1"}
        await until("the slices without the held group", lambda: pool(apiserver)[1] == expected)
        shutil.rmtree(holder)  # the VM stopped
        await until("the group published", lambda: pool(apiserver)[1] == set(PUBLISHED))
    finally:
        await plugin.stop()


def test_withdraw_held_names_the_holder() -> None:
    from vfio_dp.model.address import PciAddress

    a = PciAddress.parse("0000:af:00.1")
    unit = DraUnit("pci-0000-af-00-1", 61, a, (a,), "devices.kubevirt.io/mlx-vf", False)
    (out,) = withdraw_held([unit], {61: "/dev/vfio/61 is held open by pid 4242 (qemu-kvm) fd 31"})
    assert not out.published
    assert "pid 4242 (qemu-kvm)" in out.reasons[0] and "outside any claim of ours" in out.reasons[0]
    assert withdraw_held([unit], {}) == [unit]
