"""A VF allocated to a running pod (the kubelet's PodResources API says so) blocks any SR-IOV
count change of its PF: the device-plugin daemon, its kubelet stand-ins (registration and
PodResources, real gRPC on real unix sockets) and the kernel simulator on a temp tree."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.deviceplugin.podresources_standin import Pod, PodResourcesStandin
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.deviceplugin.app import Daemon, Options
from vfio_dp.host import Host

PF, VF1, VF2 = "0000:01:00.0", "0000:01:00.1", "0000:01:00.2"
RESOURCE = "devices.kubevirt.io/nvme-vf"
CONFIG = 'selectors:\n- addresses: ["{pf}"]\n  numVfs: {n}\n  resourceName: nvme-vf\n'


async def until(cond: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_pod_allocation_blocks_count_change(
    tree: SysfsTree, kubelet: KubeletStandin, kdir: str, tmp_path: Path
) -> None:
    tree.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    tree.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
                 sriov_totalvfs=2, sriov_numvfs=0))  # fmt: skip
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.format(pf=PF, n=2))
    pr = PodResourcesStandin(os.path.join(kdir, "pr.sock"))
    await pr.start()
    d = Daemon(
        Options(
            root=str(tree.root),
            kubelet_dir=kdir,
            config_path=str(cfg),
            resync=0.1,
            metrics_port=0,
            uevents=False,
            pod_resources_socket=pr.socket,
        ),
        host=Host(tree.root, kernel=SimulatedKernel(tree), runner="device-plugin"),
    )
    await d.start()
    try:
        await kubelet.wait_for("2 VFs", lambda k: len(k.devices(RESOURCE)) == 2)
        assert set(kubelet.devices(RESOURCE)) == {VF1, VF2}
        assert tree.driver_of(VF1) == tree.driver_of(VF2) == "vfio-pci"
        await kubelet.allocate(RESOURCE, [VF2])
        pr.pods = [Pod("default", "vm-a", "compute", RESOURCE, [VF2])]
        calls = pr.calls
        cfg.write_text(CONFIG.format(pf=PF, n=1))
        # the new config is read (a reload: up to a watch interval) and the change refused;
        # counting PodResources calls alone raced the reload on a loaded machine
        await until(lambda: "is held" in " ".join(d.core.sriov_pass.said) and pr.calls > calls)
        assert VF2 in tree.devs and tree.driver_of(VF2) == "vfio-pci"  # refused: held
        said = " ".join(d.core.sriov_pass.said)
        assert "pod default/vm-a container compute" in said and "is held" in said
        pr.pods = []  # the pod ended
        await until(lambda: VF2 not in tree.devs)
        await kubelet.wait_for("1 VF", lambda k: set(k.devices(RESOURCE)) == {VF1})
    finally:
        await d.stop()
        await pr.stop()
