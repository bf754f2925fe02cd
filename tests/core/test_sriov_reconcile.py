"""The node core makes the VFs a ``numVfs`` selector asks, at start and on reload, binds them
through its ``bind: true`` pass, and gives a PF back when the config stops asking (kernel
simulator on a temp tree)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree, gpu_host
from vfio_dp.core.node import CoreOptions, NodeCore
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text

PF, VF1, VF2 = "0000:01:00.0", "0000:01:00.1", "0000:01:00.2"

CONFIG = """selectors:
- addresses: ["{pf}"]
  numVfs: {n}
  resourceName: nvme-vf
"""


def nvme_tree(base: Path) -> SysfsTree:
    t = gpu_host(base)
    t.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    t.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
              sriov_totalvfs=2, sriov_numvfs=0))  # fmt: skip
    return t


def test_start_reload_and_give_back(tmp_path: Path) -> None:
    tree = nvme_tree(tmp_path / "root")
    sim = SimulatedKernel(tree)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(pf=PF, n=2))
    core = NodeCore(
        CoreOptions(root=str(tree.root), config_path=str(cfg), metrics_port=0, uevents=False),
        Host(tree.root, kernel=sim, runner="device-plugin"),
    )
    autoprobe = tree.dev_dir(PF) / "sriov_drivers_autoprobe"

    async def scenario() -> None:
        await core.start()
        try:
            assert tree.driver_of(VF1) == tree.driver_of(VF2) == "vfio-pci"
            inv = core.inventory
            assert inv is not None and PciAddress.parse(VF2) in inv.devices
            assert core.config.resource_for(inv.devices[PciAddress.parse(VF1)]) == (
                "devices.kubevirt.io/nvme-vf"
            )
            assert autoprobe.read_text().strip() == "0"
            await core.apply_config(load_config_text(CONFIG.format(pf=PF, n=1), "t"))
            assert VF2 not in tree.devs and tree.driver_of(VF1) == "vfio-pci"
            # no numVfs selector any more: the PF goes back to what it had (0, autoprobe 1)
            await core.apply_config(load_config_text('selectors:\n- {vendor: "8086"}\n', "t"))
            assert VF1 not in tree.devs and autoprobe.read_text().strip() == "1"
            assert not (tree.root / "var/lib/vfio_dp/sriov" / f"{PF}.json").exists()
            assert list((tree.root / "var/lib/vfio_dp/original").glob("0000:01:00.*")) == []
        finally:
            await core.close()

    asyncio.run(scenario())


class Killed(BaseException):
    """The process died (SIGKILL): nothing catches this."""


def test_start_recovers_a_change_the_daemon_was_killed_in(tmp_path: Path) -> None:
    tree = nvme_tree(tmp_path / "root")

    class KilledAfterCount(SimulatedKernel):
        def write(self, path: str, data: str) -> None:
            super().write(path, data)
            if path.endswith("sriov_numvfs"):
                raise Killed(path)

    from vfio_dp.host.sriov import Sriov

    # an older version's daemon (runner "daemon"): the device plugin recovers its journal
    dying = Host(tree.root, kernel=KilledAfterCount(tree), runner="daemon")
    with contextlib.suppress(Killed):
        Sriov(dying, by="daemon").set(PciAddress.parse(PF), 2)
    ops = tree.root / "var/lib/vfio_dp/sriov/ops"
    assert [p.name for p in ops.glob("*.json")] == [f"{PF}.json"] and VF1 in tree.devs
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(pf=PF, n=2))
    sim = SimulatedKernel(tree)
    core = NodeCore(
        CoreOptions(root=str(tree.root), config_path=str(cfg), metrics_port=0, uevents=False),
        Host(tree.root, kernel=sim, runner="device-plugin"),
    )

    async def scenario() -> None:
        await core.start()
        await core.close()

    asyncio.run(scenario())
    numvfs = [d.strip() for p, d in sim.writes if p.endswith("sriov_numvfs")]
    assert numvfs == ["0", "2"]  # put back first, then made again by the config
    assert list(ops.glob("*.json")) == []
    assert tree.driver_of(VF1) == tree.driver_of(VF2) == "vfio-pci"
    assert any("undid the interrupted" in m for m in core.sriov_pass.said)


def test_each_path_reconciles_only_its_own_selectors(tmp_path: Path) -> None:
    """The DRA plugin's core neither makes the device plugin's VFs nor gives them back."""
    from vfio_dp.model.config import DRA

    tree = nvme_tree(tmp_path / "root")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(pf=PF, n=2))  # path: devicePlugin (the default)

    def core(path: str, sim: SimulatedKernel) -> NodeCore:
        front_end = "dra-plugin" if path == DRA else "device-plugin"
        opts = CoreOptions(
            root=str(tree.root),
            config_path=str(cfg),
            metrics_port=0,
            uevents=False,
            path=path,
            front_end=front_end,
        )
        return NodeCore(opts, Host(tree.root, kernel=sim, runner=front_end))

    async def start_stop(c: NodeCore) -> None:
        await c.start()
        await c.close()

    dra_sim = SimulatedKernel(tree)
    asyncio.run(start_stop(core(DRA, dra_sim)))
    assert dra_sim.writes == [] and VF1 not in tree.devs
    asyncio.run(start_stop(core("devicePlugin", SimulatedKernel(tree))))
    assert VF2 in tree.devs
    cfg.write_text('selectors:\n- {vendor: "8086", path: dra}\n')  # the DRA config has none
    dra_sim = SimulatedKernel(tree)
    asyncio.run(start_stop(core(DRA, dra_sim)))
    assert not any("sriov" in p for p, _ in dra_sim.writes) and VF2 in tree.devs
