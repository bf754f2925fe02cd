"""Writes never leave ``--root`` (issue 11 item 5), with openat2 and with the fallback walk.

Each test plants a symlink that leads out of a temp root -- ``sys/devices/pci0000:00``, the
whole ``sys``, an absolute ``bus/pci/devices/<bdf>`` link, ``var/lib/vfio_dp``,
``run/vfio_dp`` -- and runs a real bind with :class:`RealKernel` (plain-file writes, as the
sysfs writes they stand for). Before the fix each of them wrote ``driver_override`` (and the
records, the locks) into the directory outside; now each is refused before the first write,
naming the path, and nothing outside changes. The normal tree's RELATIVE links (what every
real node has) keep working in both modes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree, gpu_host
from vfio_dp.errors import HostError, PathEscapeError, StateWriteError
from vfio_dp.host import Host
from vfio_dp.host import root as root_mod
from vfio_dp.host.kernel import RealKernel
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress

NIC = "0000:03:01.0"


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run each test with openat2 (when this kernel has it) and with the component walk."""
    if request.param == "walk":
        monkeypatch.setattr(root_mod, "_openat2_ok", False, raising=False)
    elif hasattr(Root, "open"):
        probe = Root(Path(__file__).parent)
        os.close(probe.open(f"{probe.base}/.", os.O_RDONLY | os.O_DIRECTORY))
        if root_mod.openat2_available() is False:
            pytest.skip("this kernel (or seccomp) refuses openat2; the walk mode covers it")
    yield str(request.param)


def snapshot(d: Path) -> dict[str, bytes | str]:
    """Every file and link under ``d`` with its content (to prove nothing changed)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(d.rglob("*")):
        rel = str(p.relative_to(d))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


def small_tree(base: Path) -> SysfsTree:
    t = SysfsTree(base)
    t.ensure_driver("vfio-pci")  # loaded: no modprobe
    t.add(Dev("0000:00:1f.0", "1b36", "000e", "060400", group=7))
    t.add(Dev(NIC, "8086", "100e", "020000", driver="e1000", group=8, parent="0000:00:1f.0"))
    return t


def real_host(t: SysfsTree) -> Host:
    """The production kernel I/O (plain-file writes in a temp tree, never the real /sys)."""
    h = Host(t.root, write_timeout=5)
    assert isinstance(h.kernel, RealKernel)
    return h


def move_out(link: Path, outside: Path, *, absolute: bool) -> None:
    """Move ``link`` (a directory) to ``outside`` and leave a symlink to it in its place."""
    shutil.move(str(link), str(outside))
    target = str(outside) if absolute else os.path.relpath(outside, link.parent)
    link.symlink_to(target)


@pytest.mark.parametrize(
    ("what", "absolute"),
    [
        ("sys/devices/pci0000:00", True),
        ("sys/devices/pci0000:00", False),
        ("sys", True),
        ("sys", False),
    ],
)
def test_bind_never_writes_through_a_directory_link_out_of_the_root(
    tmp_path: Path, mode: str, what: str, absolute: bool
) -> None:
    t = small_tree(tmp_path / "root")
    outside = tmp_path / "outside"
    move_out(t.root / what, outside, absolute=absolute)
    before = snapshot(outside)
    with pytest.raises(PathEscapeError) as e:
        real_host(t).bind([PciAddress.parse(NIC)], group=True)
    assert "outside the root" in str(e.value) and NIC in str(e.value)
    assert e.value.via is not None and what in e.value.via  # names the link that leaves
    assert snapshot(outside) == before  # no driver_override, unbind, drivers_probe written
    assert not (t.root / "var/lib/vfio_dp/original").exists() or not any(
        (t.root / "var/lib/vfio_dp/original").iterdir()
    )
    # discovery skips what leaves the root: no device read from outside
    assert PciAddress.parse(NIC) not in Host(t.root).scan(usage=False).devices


def test_absolute_device_link_out_of_the_root_is_refused(tmp_path: Path, mode: str) -> None:
    t = small_tree(tmp_path / "root")
    outside = tmp_path / "outside"
    outside.mkdir()
    dev_dir = t.dev_dir(NIC)
    shutil.copytree(dev_dir, outside / NIC, symlinks=True)
    link = t.root / "sys/bus/pci/devices" / NIC
    link.unlink()
    link.symlink_to(outside / NIC)  # absolute, like a planted /sys/bus/pci/devices entry
    before = snapshot(outside)
    with pytest.raises(PathEscapeError) as e:
        real_host(t).bind([PciAddress.parse(NIC)], group=True)
    assert f"sys/bus/pci/devices/{NIC} -> {outside / NIC}" in str(e.value)
    assert snapshot(outside) == before
    assert PciAddress.parse(NIC) not in Host(t.root).scan(usage=False).devices


@pytest.mark.parametrize("state", ["var/lib/vfio_dp", "run/vfio_dp"])
@pytest.mark.parametrize("absolute", [True, False])
def test_records_and_locks_never_leave_the_root(
    tmp_path: Path, mode: str, state: str, absolute: bool
) -> None:
    t = small_tree(tmp_path / "root")
    kernel = SimulatedKernel(t)
    outside = tmp_path / "outside"
    outside.mkdir()
    link = t.root / state
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside if absolute else os.path.relpath(outside, link.parent))
    with pytest.raises((PathEscapeError, StateWriteError)) as e:
        Host(t.root, kernel=kernel).bind([PciAddress.parse(NIC)], group=True)
    msg = str(e.value)
    assert "outside the root" in msg and state in msg
    assert "before the first sysfs write" in msg or "refusing" in msg
    assert list(outside.iterdir()) == []  # no record, no journal, no lock outside
    assert kernel.writes == []  # refused before the first sysfs write
    assert t.driver_of(NIC) == "e1000"


def test_unbind_never_writes_outside_either(tmp_path: Path, mode: str) -> None:
    t = small_tree(tmp_path / "root")
    kernel = SimulatedKernel(t)
    Host(t.root, kernel=kernel).bind([PciAddress.parse(NIC)], group=True)
    outside = tmp_path / "outside"
    move_out(t.root / "sys/devices/pci0000:00", outside, absolute=True)
    before = snapshot(outside)
    with pytest.raises(PathEscapeError):
        real_host(t).unbind([PciAddress.parse(NIC)])
    assert snapshot(outside) == before
    # the record of the original driver is still there for when the tree is fixed
    assert (t.root / f"var/lib/vfio_dp/original/{NIC}.json").exists()


def test_relative_links_inside_the_root_keep_working(tmp_path: Path, mode: str) -> None:
    """What every real node has: bus/pci/devices/<bdf> -> ../../../devices/... (inside)."""
    t = gpu_host(tmp_path / "root")
    kernel = SimulatedKernel(t)
    # the state directories may be relative links that stay inside (e.g. /var/run -> ../run)
    (t.root / "data").mkdir()
    (t.root / "var/lib").mkdir(parents=True)
    (t.root / "var/lib/vfio_dp").symlink_to("../../data")
    h = Host(t.root, kernel=kernel)
    res = h.bind([PciAddress.parse("0000:3b:00.0")], group=True)
    assert len(res.bound) == 2
    assert (t.root / "data/original/0000:3b:00.0.json").exists()
    res = h.unbind([PciAddress.parse("0000:3b:00.0"), PciAddress.parse("0000:3b:00.1")])
    assert [d for _, d in res.restored] == ["nvidia", "snd_hda_intel"]
    assert len(h.scan().devices) == len(t.devs)


def test_root_open_rules(tmp_path: Path, mode: str) -> None:
    base = tmp_path / "root"
    (base / "a/b").mkdir(parents=True)
    (base / "a/b/f").write_text("x")
    (base / "up").symlink_to("a/b")
    (base / "a/b/back").symlink_to("../../a/b/f")  # climbs, but stays inside
    (base / "a/climb").symlink_to("../../outside")  # climbs above the root
    (base / "abs").symlink_to("/etc")
    r = Root(base)
    for ok in ("up/f", "a/b/back", "a/b/../b/f"):
        fd = r.open(f"{base}/{ok}", os.O_RDONLY)
        assert os.read(fd, 1) == b"x"
        os.close(fd)
    with pytest.raises(PathEscapeError, match=r"a/climb"):
        r.open(f"{base}/a/climb/x", os.O_RDONLY)
    with pytest.raises(PathEscapeError, match=r"abs -> /etc"):
        r.open(f"{base}/abs/passwd", os.O_RDONLY)
    with pytest.raises(PathEscapeError):
        r.open(f"{base}/../x", os.O_RDONLY)
    with pytest.raises(FileNotFoundError):
        r.open(f"{base}/a/missing", os.O_RDONLY)
    with pytest.raises(PathEscapeError):
        r.open("/etc/passwd", os.O_RDONLY)  # not under the root at all
    fd = r.open_dir("x", "y", "z", create=True)
    os.close(fd)
    assert (base / "x/y/z").is_dir()
    with pytest.raises(PathEscapeError):
        r.open_dir("abs", "sub", create=True)
    assert not Path("/etc/sub").exists()
    assert isinstance(PathEscapeError("p", "r"), HostError)


def test_openat2_is_used_where_the_kernel_has_it(tmp_path: Path, mode: str) -> None:
    """Reported, not assumed: which mechanism resolved the paths here."""
    r = Root(tmp_path)
    os.close(r.open(f"{tmp_path}/.", os.O_RDONLY | os.O_DIRECTORY))
    assert root_mod.openat2_available() is (mode == "openat2")


def test_the_daemons_allocation_record_stays_inside_the_root(tmp_path: Path, mode: str) -> None:
    """``<root>/var/lib/vfio_dp`` linked outside: the core's allocation record is neither
    written nor read there (the flush fails with the path named, nothing appears outside)."""
    from vfio_dp.deviceplugin.allocation import Grant
    from vfio_dp.deviceplugin.allocation_store import AllocationStore

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "var/lib").mkdir(parents=True)
    outside.mkdir()
    (outside / "allocations.json").write_text('{"planted": true}')
    (root / "var/lib/vfio_dp").symlink_to(outside)
    store = AllocationStore(Root(root))
    store.load()
    assert store.record == {} and store.problem is not None  # the planted file was not read
    store.add(
        [Grant("g12", "devices.kubevirt.io/8086_10d3", 12, "/dev/vfio/12", ("0000:65:00.0",))]
    )
    with pytest.raises(OSError, match="var/lib/vfio_dp"):
        store.flush()
    assert sorted(p.name for p in outside.iterdir()) == ["allocations.json"]
    assert (outside / "allocations.json").read_text() == '{"planted": true}'
