"""One instance per node process, and `unbind --all` refusing while one of ours runs.

Real processes hold real ``flock``s on real files under a temp root; SIGKILL shows the kernel
drops the lock (no stale lock after a crash).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vfio_dp.errors import InstanceRunningError, PathEscapeError
from vfio_dp.host.instance import DEVICE_PLUGIN, InstanceLock, lock_name, none_running
from vfio_dp.host.root import Root

HOLD = """
import sys, time
from vfio_dp.host.instance import InstanceLock
from vfio_dp.host.root import Root
lock = InstanceLock(Root(sys.argv[1]), sys.argv[2])
lock.acquire(0)
print("held", flush=True)
time.sleep(float(sys.argv[3]))  # the scenario: hold the lock this long (or until killed)
"""


def _holder(root: Path, name: str, seconds: float = 60) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), name, str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def test_second_instance_fails_naming_the_first_ones_pid(root: Path) -> None:
    name = lock_name(DEVICE_PLUGIN)
    first = _holder(root, name)
    try:
        seen: list[int | None] = []
        with pytest.raises(InstanceRunningError) as e:
            InstanceLock(Root(str(root)), name).acquire(0.5, seen.append)
        assert seen == [first.pid]
        assert (
            f"the device plugin (vfioctl plugin) already runs on this node (pid {first.pid})"
            in str(e.value)
        )
        assert "waited 0.5 s" in str(e.value)
    finally:
        first.kill()
        first.communicate(timeout=10)


def test_a_killed_holder_leaves_no_stale_lock_and_a_waiter_takes_over(root: Path) -> None:
    name = lock_name("dra-plugin", "vfio.example.com")
    assert name == "dra-plugin.vfio.example.com.lock"
    first = _holder(root, name)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=10)
    lock = InstanceLock(Root(str(root)), name)
    lock.acquire(0)
    assert (root / "run/vfio_dp/instances" / name).read_text() == f"{os.getpid()}\n"
    lock.release()
    # a holder that exits on its own: the waiter takes over within its bound
    second = _holder(root, name, seconds=0.5)
    t0 = time.monotonic()
    lock.acquire(30)
    assert time.monotonic() - t0 < 30
    second.communicate(timeout=10)
    lock.release()


def test_none_running_blocks_starts_and_names_running_processes(root: Path) -> None:
    r = Root(str(root))
    dp = InstanceLock(r, lock_name(DEVICE_PLUGIN))
    dp.acquire(0)
    dp.release()  # the file exists (a daemon ran since boot), nobody holds it
    # while it runs, no process of ours can start
    with none_running(r, "unbind --all refused"), pytest.raises(InstanceRunningError):
        InstanceLock(r, lock_name(DEVICE_PLUGIN)).acquire(0.2)
    holder = _holder(root, lock_name("dra-plugin", "vfio.example.com"))
    try:
        with pytest.raises(InstanceRunningError) as e, none_running(r, "unbind --all refused"):
            pytest.fail("the body must not run")
        assert (
            f"the DRA plugin for vfio.example.com (vfioctl dra-plugin) (pid {holder.pid})"
            in str(e.value)
        )
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    with none_running(r, "x"):
        pass


def test_unbind_all_refuses_while_a_daemon_of_ours_runs(root: Path) -> None:
    holder = _holder(root, lock_name(DEVICE_PLUGIN))
    vfioctl = [sys.executable, "-c", "from cli.main import main; main()"]
    try:
        out = subprocess.run(
            [*vfioctl, "unbind", "--all", "--root", str(root)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert out.returncode == 1, out
        assert (
            f"unbind --all refused: the device plugin (vfioctl plugin) (pid {holder.pid}) runs"
            in out.stderr
        )
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    forced = subprocess.run(
        [*vfioctl, "unbind", "--all", "--force", "--root", str(root)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert forced.returncode == 2
    assert "--all never takes a group a process holds open" in forced.stderr


def test_the_lock_never_leaves_the_root(
    root: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (root / "run").mkdir()
    (root / "run/vfio_dp").symlink_to(outside)
    with pytest.raises(PathEscapeError):
        InstanceLock(Root(str(root)), lock_name(DEVICE_PLUGIN)).acquire(0)
    assert list(outside.iterdir()) == []


def test_unbind_all_under_the_shared_locks_takes_its_own_device_locks(tmp_path: Path) -> None:
    """The per-device bind locks (run/vfio_dp/<address>.lock) are not instance locks: a real
    `unbind --all` (in the guest it timed out after 10 s on its own shared lock) finishes."""
    from tests.kernel_sim import SimulatedKernel
    from tests.sysfs_tree import Dev, SysfsTree
    from vfio_dp.host import Host
    from vfio_dp.model.address import PciAddress

    t = SysfsTree(tmp_path)
    t.add(Dev("0000:65:00.0", "8086", "10d3", "020000", driver="e1000e", group=7,
              native_driver="e1000e"))  # fmt: skip
    host = Host(str(tmp_path), kernel=SimulatedKernel(t))
    host.bind([PciAddress.parse("0000:65:00.0")])  # leaves run/vfio_dp/0000:65:00.0.lock
    assert (tmp_path / "run/vfio_dp/0000:65:00.0.lock").exists()
    ran = InstanceLock(Root(str(tmp_path)), lock_name(DEVICE_PLUGIN))
    ran.acquire(0)  # a daemon ran here since boot, and stopped
    ran.release()
    with none_running(Root(str(tmp_path)), "unbind --all refused"):
        result = host.unbind_all()
    # before the instance locks had their own directory, this waited 10 s on our own shared
    # lock of the device's bind lock and failed with LockTimeoutError
    assert [str(a) for a, _ in result.restored] == ["0000:65:00.0"]


def test_none_running_leaves_the_device_locks_alone(root: Path) -> None:
    """``<bdf>.lock`` (a device's bind lock, same directory) is not a process lock: holding
    it shared would make ``unbind --all``'s own bind steps wait on themselves."""
    from vfio_dp.host.state import StateStore
    from vfio_dp.model.address import PciAddress

    r = Root(str(root))
    store = StateStore(r)
    with store.locked([PciAddress.parse("0000:01:00.0")]):
        pass  # the device's lock file now exists, as after any bind
    with none_running(r, "x"), store.locked([PciAddress.parse("0000:01:00.0")], timeout=0.5):
        pass
