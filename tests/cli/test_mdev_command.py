"""``vfioctl mdev create`` / ``remove`` as a user runs them: real processes on temp trees
(tests/mdev_tree.py). A temp tree does not react to writes (the in-process tests with the
kernel's reaction are tests/host/test_mdev_ops.py; the real kernel's is the guest's): these
show the dry runs, the refusals naming the value and the fix, the journal and records, and a
process SIGKILLed (strace) between its journal write and its sysfs write being undone by the
next run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_host_commands import VFIOCTL, run
from tests.mdev_tree import add_instance, add_parent
from tests.sysfs_tree import SysfsTree, gpu_host

GPU = "0000:3b:00.0"
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
U3 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1003"


@pytest.fixture
def t(tmp_path: Path) -> SysfsTree:
    t = gpu_host(tmp_path / "root")
    add_parent(t, "mtty", {"mtty-1": ("Single port serial", 24, "vfio-pci"),
                           "mtty-2": ("Dual port serial", 11, "vfio-pci")}, driver="mtty")  # fmt: skip
    add_instance(t, "mtty", "mtty-2", U1, group=70)
    add_parent(t, GPU, {"nvidia-222": ("GRID T4-1Q / 1 GB", 0, "vfio-pci")})
    return t


def create_file(t: SysfsTree, parent: str, type_id: str) -> Path:
    return t.root / "sys/class/mdev_bus" / parent / "mdev_supported_types" / type_id / "create"


def test_create_dry_run_prints_the_writes_and_changes_nothing(t: SysfsTree) -> None:
    p = run("mdev", "create", "--root", str(t.root), "--dry-run", "mtty", "mtty-2",
            "--uuid", U2, "--uuid", U3)  # fmt: skip
    assert p.returncode == 0, p.stderr
    f = create_file(t, "mtty", "mtty-2")
    assert p.stdout.splitlines() == [f"echo {U2} > {f}", f"echo {U3} > {f}"]
    assert f.read_text() == "" and not (t.root / "var/lib/vfio_dp/mdev").exists()
    p = run("mdev", "--root", str(t.root), "create", "--dry-run", "-o", "json", "mtty", "mtty-1",
            "--count", "3")  # fmt: skip
    doc = json.loads(p.stdout)
    assert len(set(doc["uuids"])) == 3 and doc["dryRun"] is True


def test_create_writes_the_uuid_journal_free_and_recorded(t: SysfsTree) -> None:
    p = run("mdev", "create", "--root", str(t.root), "mtty", "mtty-2", "--uuid", U2)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"mdev/{U2} created\n"
    assert create_file(t, "mtty", "mtty-2").read_text() == f"{U2}\n"
    rec = json.loads((t.root / f"var/lib/vfio_dp/mdev/{U2}.json").read_text())
    assert rec["by"] == "operator" and list((t.root / "var/lib/vfio_dp/mdev/ops").glob("*")) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nope", "mtty-2"], "no mdev parent 'nope' under /sys/class/mdev_bus (parents: "
         f"{GPU}, mtty); name one of them, or load its vendor driver (e.g. modprobe mtty)"),
        (["mtty", "mtty-9"], "mdev parent mtty has no type 'mtty-9' (its types: mtty-1"),
        ([GPU, "nvidia-222"], f"type nvidia-222 of {GPU} has available_instances 0, 1 asked"),
        (["mtty", "mtty-2", "--uuid", "not-a-uuid"], "'not-a-uuid' is not an mdev UUID: give a "
         "lowercase UUID, 8-4-4-4-12 hex digits (make one with uuidgen)"),
        (["mtty", "mtty-2", "--uuid", U1], f"an mdev {U1} already exists"),
    ],
)  # fmt: skip
def test_create_refusals(t: SysfsTree, args: list[str], says: str) -> None:
    p = run("mdev", "create", "--root", str(t.root), *args)
    assert p.returncode != 0 and says in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_count_and_uuids_must_agree(t: SysfsTree) -> None:
    p = run("mdev", "create", "--root", str(t.root), "mtty", "mtty-2", "--count", "2",
            "--uuid", U2)  # fmt: skip
    assert p.returncode == 2 and "give one --uuid per instance" in p.stderr


def test_remove_refuses_others_instances_unless_forced(t: SysfsTree) -> None:
    p = run("mdev", "remove", "--root", str(t.root), U1)
    assert p.returncode != 0
    assert f"mdev {U1} was not made by vfio_dp (no record): left alone; add --force" in p.stderr
    p = run("mdev", "remove", "--root", str(t.root), "--dry-run", "--force", U1)
    assert p.stdout == f"echo 1 > {t.root}/sys/bus/mdev/devices/{U1}/remove\n", p.stderr
    p = run("mdev", "remove", "--root", str(t.root), "--force", U1)
    assert p.returncode == 0 and p.stdout == f"mdev/{U1} removed\n", p.stderr
    assert (t.root / f"sys/bus/mdev/devices/{U1}/remove").read_text() == "1\n"


def test_remove_refuses_an_instance_held_open(t: SysfsTree) -> None:
    fd = t.root / "proc/812/fd"
    fd.mkdir(parents=True)
    (t.root / "proc/812/comm").write_text("qemu-kvm\n")
    (fd / "31").symlink_to("/dev/vfio/70")
    p = run("mdev", "remove", "--root", str(t.root), "--force", U1)
    assert p.returncode != 0
    assert f"mdev {U1} is held: /dev/vfio/70 is held open by pid 812 (qemu-kvm) fd 31" in p.stderr
    assert (t.root / f"sys/bus/mdev/devices/{U1}/remove").read_text() == ""


def test_listing_says_who_made_each(t: SysfsTree) -> None:
    run("mdev", "create", "--root", str(t.root), "mtty", "mtty-2", "--uuid", U2)
    add_instance(t, "mtty", "mtty-2", U2, group=71)  # what the kernel would have done
    doc = json.loads(run("mdev", "--root", str(t.root), "-o", "json").stdout)
    mtty = next(p for p in doc if p["parent"] == "mtty")
    assert {i["uuid"]: i["madeBy"] for i in mtty["instances"]} == {U1: None, U2: "operator"}


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("action", ["create", "remove"])
def test_killed_between_journal_and_sysfs_write_is_undone_by_the_next_run(
    t: SysfsTree, action: str
) -> None:
    """strace SIGKILLs vfioctl on entering its one sysfs write (``-P`` the file): the journal
    is left; the next run on the parent undoes it (nothing was made or removed) and goes on."""
    if action == "create":
        target = create_file(t, "mtty", "mtty-2")
        cmd = ["mdev", "create", "--root", str(t.root), "mtty", "mtty-2", "--uuid", U2]
        again = ["mdev", "create", "--root", str(t.root), "mtty", "mtty-2", "--uuid", U3]
        said = f"undid the interrupted mdev create of {U2} (mtty-2 on mtty)"
        how = "it was not made"
    else:
        target = t.root / f"sys/bus/mdev/devices/{U1}/remove"
        cmd = ["mdev", "remove", "--root", str(t.root), "--force", U1]
        again = cmd
        said = f"undid the interrupted mdev remove of {U1} (mtty-2 on mtty)"
        how = "it is still there; kept"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    strace = [shutil.which("strace") or "strace", "-f", "-qq", "-o", os.devnull,
              "-P", os.path.realpath(target), "-e", "trace=write",
              "-e", "inject=write:signal=KILL:when=1"]  # fmt: skip
    p = subprocess.run([*strace, *VFIOCTL, *cmd], capture_output=True, text=True, timeout=60,
                       env=env)  # fmt: skip
    assert p.returncode in (-9, 128 + 9), (p.returncode, p.stderr)
    ops = t.root / "var/lib/vfio_dp/mdev/ops"
    assert [f.stem for f in ops.glob("*.json")] == [U2 if action == "create" else U1]
    assert target.read_text() == ""  # killed before the write
    p = run(*again)
    assert p.returncode == 0, p.stderr
    assert said in p.stderr and how in p.stderr, p.stderr
    assert list(ops.glob("*.json")) == []
    assert not (t.root / f"var/lib/vfio_dp/mdev/{U2}.json").exists()
