"""What an operator pastes and what the environment may not do (issue 21 items 9 and 10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sysfs_tree import Dev, SysfsTree

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*VFIOCTL, *args], capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.fixture
def bound(tmp_path: Path) -> Path:
    """A NIC on vfio-pci with the record `vfioctl bind` writes (it was on e1000e)."""
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:65:00.0", "8086", "10d3", "020000", driver="vfio-pci", group=7))
    state = tmp_path / "var/lib/vfio_dp/original"
    state.mkdir(parents=True)
    rec = {"address": "0000:65:00.0", "driver": "e1000e", "driver_override": None,
           "vendor": "8086", "device": "10d3"}  # fmt: skip
    (state / "0000:65:00.0.json").write_text(json.dumps(rec))
    t.ensure_driver("e1000e")
    return tmp_path


def test_unbind_dry_run_is_a_script_that_makes_the_same_writes(bound: Path) -> None:
    p = _run("unbind", "--root", str(bound), "--dry-run", "0000:65:00.0")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "# 0000:65:00.0: back to e1000e"
    dev = bound / "sys/bus/pci/devices/0000:65:00.0"
    assert f"echo > {dev}/driver_override" in lines
    assert "\\n" not in p.stdout
    # pasted into a shell (the temp tree's sysfs files are plain files): the same bytes land
    # that vfioctl itself writes
    (dev / "driver_override").write_text("vfio-pci\n")
    subprocess.run(["sh", "-e"], input=p.stdout, text=True, check=True, timeout=30)
    assert (dev / "driver_override").read_text() == "\n"
    bind = bound / "sys/bus/pci/drivers/e1000e/bind"
    assert bind.read_text() == "0000:65:00.0\n"
    js = json.loads(
        _run("unbind", "--root", str(bound), "--dry-run", "-o", "json", "0000:65:00.0").stdout
    )
    assert js["restored"] == [{"address": "0000:65:00.0", "driver": "e1000e"}]


@pytest.mark.parametrize(
    ("var", "argv"),
    [
        ("VFIOCTL_FORCE", ["bind", "0000:65:00.0"]),
        ("VFIOCTL_FORCE", ["unbind", "0000:65:00.0"]),
        ("VFIOCTL_ALL", ["unbind"]),
    ],
)
def test_destructive_flags_are_refused_from_the_environment(
    bound: Path, var: str, argv: list[str]
) -> None:
    before = sorted(p.name for p in (bound / "var/lib/vfio_dp/original").iterdir())
    p = _run(*argv, "--root", str(bound), env={var: "1"})
    assert p.returncode == 2, p
    flag = "--" + var.removeprefix("VFIOCTL_").lower()
    assert f"{var} is set, but {flag} is never read from the environment" in p.stderr
    assert sorted(q.name for q in (bound / "var/lib/vfio_dp/original").iterdir()) == before


def test_dry_run_from_the_environment_still_works(bound: Path) -> None:
    p = _run("unbind", "--root", str(bound), "0000:65:00.0", env={"VFIOCTL_DRY_RUN": "1"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("# 0000:65:00.0: back to e1000e")
    assert (bound / "var/lib/vfio_dp/original/0000:65:00.0.json").exists()


def test_groups_says_used_by_the_host_not_bind_the_group(tmp_path: Path) -> None:
    """A group holding the host's root disk: "used by the host", never a bind hint."""
    from dataclasses import replace

    from vfio_dp.host import Host
    from vfio_dp.model.device import HostUse, analyse_group

    t = SysfsTree(tmp_path)
    t.add(Dev("0000:00:02.0", "1af4", "1001", "010000", driver="virtio-pci", group=3))
    t.add(Dev("0000:00:02.1", "1af4", "1001", "010000", driver="virtio-pci", group=3))
    root_use = HostUse(
        "block device vda1 is mounted at / (the host's root filesystem)",
        "pick another device: the host cannot run without its root disk",
        critical=True,
    )
    inv = Host(str(tmp_path)).scan(usage=False)
    members = [
        replace(d, in_use=(root_use,)) if str(a).endswith(".0") else d
        for a, d in sorted(inv.devices.items())
    ]
    g = analyse_group(3, members)
    assert not g.viable
    (p0,) = [p for p in g.problems if str(p.address).endswith(".0")]
    assert "is used by the host" in p0.reason and "cannot be passed through" in p0.reason
    assert "vfioctl bind" not in p0.reason and "--force" not in p0.reason
    (p1,) = [p for p in g.problems if str(p.address).endswith(".1")]
    assert "vfioctl bind --group 0000:00:02.1" in p1.reason  # a plain sibling still may be
