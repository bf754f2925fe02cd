"""SR-IOV count changes against the kernel simulator (tests/kernel_sim.py) on temp trees.

The PF is modelled on QEMU's emulated NVMe (``1b36:0010`` on ``nvme``, ``sriov_totalvfs``
2, VFs sharing the PF's vendor:device), the one the guest rig proves the same paths on.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree, gpu_host
from vfio_dp.errors import BindError, RefusedError
from vfio_dp.host import Host
from vfio_dp.host.sriov import Sriov
from vfio_dp.host.sriov_pf import list_pfs, read_pf
from vfio_dp.model.address import PciAddress

PF = "0000:01:00.0"
VF1, VF2 = "0000:01:00.1", "0000:01:00.2"
MLX_PF = "0000:af:00.0"  # gpu_host's PF with 2 VFs someone else made


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


@pytest.fixture
def nvme_tree(tmp_path: Path) -> SysfsTree:
    t = gpu_host(tmp_path / "root")
    t.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    t.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
              sriov_totalvfs=2, sriov_numvfs=0))  # fmt: skip
    return t


@pytest.fixture
def sim(nvme_tree: SysfsTree) -> SimulatedKernel:
    return SimulatedKernel(nvme_tree)


def sriov(tree: SysfsTree, kernel: SimulatedKernel, by: str = "operator") -> Sriov:
    return Sriov(Host(tree.root, kernel=kernel), by=by)


def writes(kernel: SimulatedKernel) -> list[tuple[str, str]]:
    return [(p.split("/sys/bus/pci/")[1], d.strip()) for p, d in kernel.writes]


def record(tree: SysfsTree) -> dict[str, object] | None:
    p = tree.root / f"var/lib/vfio_dp/sriov/{PF}.json"
    return json.loads(p.read_text()) if p.exists() else None


def autoprobe(tree: SysfsTree, pf: str = PF) -> str:
    return (tree.dev_dir(pf) / "sriov_drivers_autoprobe").read_text().strip()


def test_reads_pfs_and_their_vfs(nvme_tree: SysfsTree, sim: SimulatedKernel) -> None:
    h = Host(nvme_tree.root, kernel=sim)
    pfs = {str(p.address): p for p in list_pfs(h)}
    assert set(pfs) == {MLX_PF, PF}
    mlx = pfs[MLX_PF]
    assert (mlx.driver, mlx.totalvfs, mlx.numvfs, mlx.autoprobe) == ("mlx5_core", 8, 2, 1)
    assert mlx.vfs == (A("0000:af:00.1"), A("0000:af:00.2"))
    assert read_pf(h, A(VF1)) is None and read_pf(h, A("0000:03:01.0")) is None


def test_make_two_vfs_autoprobe_off_bound_to_vfio_and_recorded(
    nvme_tree: SysfsTree, sim: SimulatedKernel
) -> None:
    res = sriov(nvme_tree, sim).set(A(PF), 2)
    assert writes(sim)[:2] == [
        (f"devices/{PF}/sriov_drivers_autoprobe", "0"),
        (f"devices/{PF}/sriov_numvfs", "2"),
    ]
    assert res.made == [A(VF1), A(VF2)] and res.bound == [A(VF1), A(VF2)]
    assert nvme_tree.driver_of(VF1) == nvme_tree.driver_of(VF2) == "vfio-pci"
    groups = {os.readlink(nvme_tree.dev_dir(v) / "iommu_group") for v in (VF1, VF2)}
    assert len(groups) == 2  # each VF alone in its group (ACS)
    assert record(nvme_tree) == {
        "address": PF, "before": 0, "autoprobe_before": 1, "count": 2, "by": "operator",
    }  # fmt: skip
    bind_rec = json.loads((nvme_tree.root / f"var/lib/vfio_dp/original/{VF1}.json").read_text())
    assert bind_rec["driver"] is None and bind_rec["bound_by"] == "operator"
    assert list((nvme_tree.root / "var/lib/vfio_dp/sriov/ops").glob("*.json")) == []


def test_restore_goes_through_zero_and_puts_autoprobe_back(
    nvme_tree: SysfsTree, sim: SimulatedKernel
) -> None:
    s = sriov(nvme_tree, sim)
    s.set(A(PF), 2)
    sim.writes.clear()
    results, recovered = s.restore_all()
    assert recovered == [] and [r.target for r in results] == [0]
    assert writes(sim) == [
        (f"devices/{PF}/sriov_numvfs", "0"),
        (f"devices/{PF}/sriov_drivers_autoprobe", "1"),
    ]
    assert read_pf(s.host, A(PF)).numvfs == 0  # type: ignore[union-attr]
    assert VF1 not in nvme_tree.devs and autoprobe(nvme_tree) == "1"
    assert record(nvme_tree) is None
    # the VFs' bind records went with them: nothing left for unbind --all to trip on
    assert not (nvme_tree.root / f"var/lib/vfio_dp/original/{VF1}.json").exists()
    assert s.host.unbind_all().restored == []


def test_change_count_goes_through_zero(nvme_tree: SysfsTree, sim: SimulatedKernel) -> None:
    s = sriov(nvme_tree, sim)
    s.set(A(PF), 2, bind=False)
    sim.writes.clear()
    res = s.set(A(PF), 1, bind=False)
    assert writes(sim) == [(f"devices/{PF}/sriov_numvfs", "0"), (f"devices/{PF}/sriov_numvfs", "1")]
    assert res.destroyed == [A(VF1), A(VF2)] and res.made == [A(VF1)]
    assert record(nvme_tree)["count"] == 1 and record(nvme_tree)["before"] == 0  # type: ignore[index]


def test_dry_run_prints_exact_writes_and_changes_nothing(
    nvme_tree: SysfsTree, sim: SimulatedKernel
) -> None:
    res = sriov(nvme_tree, sim).set(A(PF), 2, dry_run=True)
    root = nvme_tree.root
    assert res.steps == [
        f"echo 0 > {root}/sys/bus/pci/devices/{PF}/sriov_drivers_autoprobe",
        f"echo 2 > {root}/sys/bus/pci/devices/{PF}/sriov_numvfs",
    ]
    assert sim.writes == [] and record(nvme_tree) is None


def test_refusals_ceiling_and_pf_driver(nvme_tree: SysfsTree, sim: SimulatedKernel) -> None:
    s = sriov(nvme_tree, sim)
    with pytest.raises(RefusedError, match=r"at most 2 VFs \(sriov_totalvfs\), not 3"):
        s.set(A(PF), 3)
    nvme_tree.set_driver(PF, None)
    with pytest.raises(RefusedError, match="has no driver, and the kernel makes VFs only"):
        s.set(A(PF), 1)
    nvme_tree.set_driver(PF, "vfio-pci")
    with pytest.raises(RefusedError, match="is on vfio-pci, which cannot make VFs"):
        s.set(A(PF), 1)
    with pytest.raises(RefusedError, match="not an SR-IOV PF"):
        s.set(A("0000:03:01.0"), 1)
    assert sim.writes == []


def test_driver_without_sriov_configure_is_named(
    nvme_tree: SysfsTree, sim: SimulatedKernel
) -> None:
    sim.no_sriov_drivers.add("nvme")
    with pytest.raises(BindError, match="PF driver nvme cannot make VFs") as e:
        sriov(nvme_tree, sim).set(A(PF), 2)
    assert "put 0000:01:00.0 back to 0 VFs" in str(e.value)
    assert autoprobe(nvme_tree) == "1" and record(nvme_tree) is None  # rolled back


def test_foreign_vfs_untouched_unless_forced(nvme_tree: SysfsTree, sim: SimulatedKernel) -> None:
    s = sriov(nvme_tree, sim)
    with pytest.raises(RefusedError, match="has 2 VFs that vfio_dp did not make"):
        s.set(A(MLX_PF), 4)
    assert sim.writes == []
    res = s.set(A(MLX_PF), 4, force=True, bind=False)
    assert res.warnings and res.warnings[0].startswith("forced:")
    rec = json.loads((nvme_tree.root / f"var/lib/vfio_dp/sriov/{MLX_PF}.json").read_text())
    assert (rec["before"], rec["count"]) == (2, 4)
    # giving back: the count it had (2), autoprobe as it was (1), no force needed
    s.restore_all()
    assert read_pf(s.host, A(MLX_PF)).numvfs == 2  # type: ignore[union-attr]
    assert autoprobe(nvme_tree, MLX_PF) == "1"


def test_held_vf_blocks_any_change_even_forced(
    nvme_tree: SysfsTree, sim: SimulatedKernel, tmp_path: Path
) -> None:
    s = sriov(nvme_tree, sim)
    s.set(A(PF), 2)
    group = os.path.basename(os.readlink(nvme_tree.dev_dir(VF2) / "iommu_group"))
    # a "VM" holding the VF's group node: a process's fd link naming /dev/vfio/<N>
    fd_dir = nvme_tree.root / "proc/4242/fd"
    fd_dir.mkdir(parents=True)
    (fd_dir / "31").symlink_to(f"/dev/vfio/{group}")
    (nvme_tree.root / "proc/4242/comm").write_text("qemu-system-x86\n")
    sim.writes.clear()
    for force in (False, True):
        with pytest.raises(RefusedError, match=rf"VF {VF2} of PF {PF} is held .*pid 4242"):
            s.set(A(PF), 0, force=force)
    with pytest.raises(RefusedError, match="held"):
        s.restore_all()
    # held by a claim (given by the caller, as the DRA checkpoint says)
    (fd_dir / "31").unlink()
    with pytest.raises(RefusedError, match="claim default/vm"):
        s.set(A(PF), 1, extra={A(VF1): ["prepared for claim default/vm"]})
    assert sim.writes == [] and read_pf(s.host, A(PF)).numvfs == 2  # type: ignore[union-attr]
    s.restore_all()
    assert read_pf(s.host, A(PF)).numvfs == 0  # type: ignore[union-attr]


class Killed(BaseException):
    """The process died (SIGKILL): nothing catches this."""


@pytest.mark.parametrize("k", [1, 2])
def test_killed_mid_change_is_put_back(nvme_tree: SysfsTree, k: int) -> None:
    class KilledAfter(SimulatedKernel):
        def write(self, path: str, data: str) -> None:
            super().write(path, data)
            if len(self.writes) == k:
                raise Killed(path)

    with pytest.raises(Killed):
        sriov(nvme_tree, KilledAfter(nvme_tree)).set(A(PF), 2)
    ops = list((nvme_tree.root / "var/lib/vfio_dp/sriov/ops").glob("*.json"))
    assert len(ops) == 1 and json.loads(ops[0].read_text())["done"] == k - 1
    sim = SimulatedKernel(nvme_tree)
    s = sriov(nvme_tree, sim)
    assert [v.interrupted is not None for v in s.view() if str(v.pf.address) == PF] == [True]
    _, recovered = s.restore_all()
    assert len(recovered) == 1 and "put 0000:01:00.0 back to 0 VFs" in recovered[0]
    assert read_pf(s.host, A(PF)).numvfs == 0 and autoprobe(nvme_tree) == "1"  # type: ignore[union-attr]
    assert record(nvme_tree) is None and list(ops[0].parent.glob("*.json")) == []


def test_vfs_sharing_the_pf_group_are_reported_not_bound(
    nvme_tree: SysfsTree, sim: SimulatedKernel
) -> None:
    sim.vf_group_with_pf.add(PF)
    res = sriov(nvme_tree, sim).set(A(PF), 1)
    assert res.made == [A(VF1)] and res.bound == []
    assert res.bind_error and "could not bind 1 VF(s)" in res.bind_error, res
    assert "nvme" in res.bind_error  # the reason: the PF shares the group, on nvme
    assert nvme_tree.driver_of(VF1) is None


def test_kernel_rules_in_the_simulator(nvme_tree: SysfsTree, sim: SimulatedKernel) -> None:
    path = f"{nvme_tree.root}/sys/bus/pci/devices/{PF}/sriov_numvfs"
    sim.write(path, "2")
    assert nvme_tree.driver_of(VF1) == "nvme"  # autoprobe 1: the host driver takes them
    with pytest.raises(OSError) as e:
        sim.write(path, "1")
    assert e.value.errno == errno.EBUSY
    with pytest.raises(OSError) as e:
        sim.write(path, "3")
    assert e.value.errno == errno.ERANGE
    sim.write(path, "0")
    assert VF1 not in nvme_tree.devs and not list(nvme_tree.dev_dir(PF).glob("virtfn*"))


def test_256_vfs_go_past_function_ff_onto_the_next_bus(tmp_path: Path) -> None:
    """The simulator as the kernel (``pci_iov_virtfn_bus``): VF 256 of a PF at 40:00.0
    (offset 1, stride 1) is routing ID 0x100 past the PF's, i.e. 41:00.0 (the bench's row 3,
    ``numVfs: 256`` on 4 PFs, made invalid addresses like 40:20.0 before)."""
    t = SysfsTree(tmp_path / "root")
    t.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    t.add(Dev("0000:40:00.0", "1b36", "0010", "010802", driver="nvme", group=9,
              parent="0000:00:1b.0", sriov_totalvfs=256, sriov_numvfs=0))  # fmt: skip
    kernel = SimulatedKernel(t)
    kernel.write(str(t.sys("bus/pci/devices/0000:40:00.0/sriov_numvfs")), "256")  # Sriov.set
    vfs = sorted(str(a) for a, d in Host(t.root).scan().devices.items() if d.physfn is not None)
    assert len(vfs) == 256 and vfs[0] == "0000:40:00.1" and vfs[-1] == "0000:41:00.0"
    assert "0000:40:1f.7" in vfs
