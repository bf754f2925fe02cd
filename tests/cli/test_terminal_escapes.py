"""Host text is shown escaped wherever vfioctl prints it to a person (issue 37.16).

The kernel allows ESC and BEL in an interface name, and a mount point in
``/proc/1/mountinfo`` can hold them (only space, tab, newline and backslash are octal-escaped
there): printed raw they would recolour, retitle or ring the operator's terminal. Real
processes on temp trees; every print to a person goes through ``cli.common.printable``.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from cli.common import printable
from tests.cli.test_host_commands import run
from tests.sysfs_tree import Dev, SysfsTree

IFNAME = "ev\x1b[31mil\x07"  # 10 bytes: within IFNAMSIZ
IFNAME_SHOWN = "ev\\x1b[31mil\\x07"
MOUNT = "/srv/\x1b]0;pwned\x07x"
MOUNT_SHOWN = "/srv/\\x1b]0;pwned\\x07x"


def controls(text: str) -> list[str]:
    """Every control character in ``text`` but the newline."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]


@pytest.fixture
def hostile(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:00:03.0", "8086", "100e", "020000", driver="e1000", group=3))
    t.add_net("0000:00:03.0", IFNAME, up=True)
    t.add(Dev("0000:00:04.0", "1af4", "1001", "010000", driver="virtio-pci", group=4))
    t.add_block("0000:00:04.0", "virtio1/block/vdb", devno="254:16")
    t.set_proc(mounts=[("254:16", MOUNT, "/dev/vdb")])
    return t


@pytest.mark.parametrize("wide", [False, True], ids=["table", "wide"])
def test_list_shows_an_interface_name_escaped(hostile: SysfsTree, wide: bool) -> None:
    p = run("list", "--root", str(hostile.root), *(["-o", "wide"] if wide else []))
    assert p.returncode == 0, p.stderr
    assert controls(p.stdout) == [], p.stdout
    assert f"network interface {IFNAME_SHOWN} is up" in p.stdout


def test_list_json_keeps_the_name_itself(hostile: SysfsTree) -> None:
    """Machines get the real name (JSON escapes it in its own syntax)."""
    p = run("list", "--root", str(hostile.root), "-o", "json")
    assert p.returncode == 0, p.stderr
    assert controls(p.stdout) == []
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert any(IFNAME in reason for reason in rows["0000:00:03.0"]["in_use"])


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        ("0000:00:03.0", f"network interface {IFNAME_SHOWN} is up"),
        ("0000:00:04.0", f"umount {MOUNT_SHOWN}"),
    ],
    ids=["interface", "mount point"],
)
def test_check_shows_host_text_escaped(hostile: SysfsTree, address: str, shown: str) -> None:
    p = run("check", "--root", str(hostile.root), address)
    assert p.returncode == 1, p.stderr
    assert controls(p.stdout + p.stderr) == [], p.stdout
    assert shown in p.stdout


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        ("0000:00:03.0", f"network interface {IFNAME_SHOWN} is up"),
        ("0000:00:04.0", f"umount {MOUNT_SHOWN}"),
    ],
    ids=["interface", "mount point"],
)
def test_bind_dry_run_refusal_shows_host_text_escaped(
    hostile: SysfsTree, address: str, shown: str
) -> None:
    p = run("bind", "--dry-run", "--root", str(hostile.root), address)
    assert p.returncode == 1, p.stdout
    assert controls(p.stdout + p.stderr) == [], p.stderr
    assert shown in p.stderr


def test_printable_keeps_plain_text_and_newlines() -> None:
    assert printable("Intel Corporation 82574L — ünïcode") == "Intel Corporation 82574L — ünïcode"
    assert printable("a\nb\x1b") == "a\nb\\x1b"
    assert printable("\x9b31m\u202eabc\x7f") == "\\x9b31m\\u202eabc\\x7f"
