"""Persistent binds (``vfioctl bind --persist``): the record, the udev rule, hostile files.

The rule's effect at boot is proven on a real kernel with a real udevd in
``tests/guest/test_persist_real_kernel.py``; here: what is written, where, and refusals.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sysfs_tree import SysfsTree
from vfio_dp.errors import CorruptRecordError, PathEscapeError
from vfio_dp.host import Host
from vfio_dp.host.persist import Persistence
from vfio_dp.model.address import PciAddress
from vfio_dp.model.persist import PersistedBind, from_json, udev_rules

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
NIC = PciAddress.parse("0000:65:00.0")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    return subprocess.run([*VFIOCTL, *args], capture_output=True, text=True, env=env, timeout=60)


def test_bind_persist_writes_record_and_rule_and_unbind_all_clears(tree: SysfsTree) -> None:
    p = _run("bind", "--root", str(tree.root), "--persist", "0000:65:00.0")
    assert p.returncode == 0, p.stderr
    rules = tree.root / "etc/udev/rules.d/05-vfio-dp-persist.rules"
    assert "0000:65:00.0: persists across reboots" in p.stdout and str(rules) in p.stdout
    text = rules.read_text()
    dev = Host(tree.root).scan(usage=False).devices[NIC]
    line = [x for x in text.splitlines() if not x.startswith("#")]
    assert line == [
        'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:65:00.0", '
        f'ATTR{{vendor}}=="0x{dev.vendor}", ATTR{{device}}=="0x{dev.device}", '
        f'ATTR{{subsystem_vendor}}=="0x{dev.subsystem_vendor}", '
        f'ATTR{{subsystem_device}}=="0x{dev.subsystem_device}", '
        'ATTR{driver_override}="vfio-pci", RUN{builtin}+="kmod load vfio-pci"'
    ]
    record = from_json((tree.root / "var/lib/vfio_dp/persist.json").read_bytes())
    assert list(record) == [NIC] and record[NIC].vendor == dev.vendor
    again = _run("bind", "--root", str(tree.root), "--persist", "0000:65:00.0")
    assert "already persists" in again.stdout
    # unbind --all (what the uninstall DaemonSet runs) forgets every persistent bind
    p = _run("unbind", "--root", str(tree.root), "--all")
    assert p.returncode == 0, p.stderr
    assert "0000:65:00.0: no longer bound at boot" in p.stdout
    assert not rules.exists() and not (tree.root / "var/lib/vfio_dp/persist.json").exists()


def test_dry_run_prints_the_rule_and_writes_nothing(tree: SysfsTree) -> None:
    p = _run("bind", "--root", str(tree.root), "--persist", "--dry-run", "0000:65:00.0")
    assert p.returncode == 0, p.stderr
    assert 'KERNEL=="0000:65:00.0"' in p.stdout and 'ATTR{driver_override}="vfio-pci"' in p.stdout
    assert not (tree.root / "etc/udev").exists()
    assert not (tree.root / "var/lib/vfio_dp/persist.json").exists()


def test_drop_keeps_the_others_and_the_rule_follows_the_record(tree: SysfsTree) -> None:
    inv = Host(tree.root).scan(usage=False)
    store = Persistence(Host(tree.root).fs)
    two = [inv.devices[NIC], inv.devices[PciAddress.parse("0000:3b:00.0")]]
    assert store.add(two) == [NIC, PciAddress.parse("0000:3b:00.0")]
    assert store.drop([NIC]) == [NIC]
    assert list(store.load()) == [PciAddress.parse("0000:3b:00.0")]
    assert "0000:65:00.0" not in Path(store.rules_path).read_text()
    assert store.drop([NIC]) == []
    assert store.drop(None) == [PciAddress.parse("0000:3b:00.0")]
    assert not Path(store.rules_path).exists()


@pytest.mark.parametrize(
    "content",
    [
        b"{",
        b'{"version": 1, "devices": 5}',
        b'{"version": 1, "devices": [{"address": "../../x", "vendor": "8086", "device": "10d3",'
        b' "subsystemVendor": "8086", "subsystemDevice": "0000"}]}',
        b'{"version": 1, "devices": [{"address": "0000:01:00.0", "vendor": "8086\\", ATTR",'
        b' "device": "10d3", "subsystemVendor": "8086", "subsystemDevice": "0000"}]}',
    ],
)
def test_a_hostile_record_is_refused_kept_and_never_turned_into_a_rule(
    tree: SysfsTree, content: bytes
) -> None:
    """A record that would inject into the udev rule (a quote in an ID) or names a path is
    refused, and `bind --persist` then writes nothing: the rule is only made from valid IDs."""
    state = tree.root / "var/lib/vfio_dp"
    state.mkdir(parents=True, exist_ok=True)
    (state / "persist.json").write_bytes(content)
    with pytest.raises(CorruptRecordError, match=r"persist\.json"):
        Persistence(Host(tree.root).fs).load()
    p = _run("bind", "--root", str(tree.root), "--persist", "0000:65:00.0")
    assert p.returncode != 0 and "persist.json" in p.stderr and "remove it" in p.stderr
    assert (state / "persist.json").read_bytes() == content
    assert not (tree.root / "etc/udev/rules.d").exists()


def test_rules_dir_linking_out_of_the_root_is_refused(tree: SysfsTree, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree.root / "etc/udev").mkdir(parents=True)
    (tree.root / "etc/udev/rules.d").symlink_to(outside)
    inv = Host(tree.root).scan(usage=False)
    with pytest.raises(PathEscapeError):
        Persistence(Host(tree.root).fs).add([inv.devices[NIC]])
    assert list(outside.iterdir()) == []


def test_ids_are_validated_before_any_rule_text() -> None:
    with pytest.raises(ValueError, match="vendor"):
        PersistedBind(NIC, '8086"', "10d3", "8086", "0000")
    rec = PersistedBind(NIC, "8086", "10d3", "8086", "a01f")
    assert udev_rules([rec]).count("\n") == 4
