"""Dry runs say everything a real run would do, and ``-o name`` names functions as kubectl
names objects (issue 38.4). Real processes on a temp tree; nothing is written (dry runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_host_commands import run
from tests.sysfs_tree import SysfsTree, gpu_host


@pytest.fixture
def host(tmp_path: Path) -> SysfsTree:
    return gpu_host(tmp_path)


def _untouched(tree: SysfsTree) -> None:
    assert not (tree.root / "etc").exists()
    assert not (tree.root / "var/lib/vfio_dp/original").exists() or not any(
        (tree.root / "var/lib/vfio_dp/original").iterdir()
    )


def test_bind_dry_run_persist_shows_the_udev_rule_of_every_device(host: SysfsTree) -> None:
    p = run("bind", "--dry-run", "--persist", "--group", "--root", str(host.root), "0000:03:01.0")
    assert p.returncode == 0, p.stderr
    rules = [ln for ln in p.stdout.splitlines() if "05-vfio-dp-persist.rules:" in ln]
    assert len(rules) == 2, p.stdout
    for addr in ("0000:03:01.0", "0000:03:02.0"):
        assert any(
            f'KERNEL=="{addr}"' in r and 'ATTR{driver_override}="vfio-pci"' in r for r in rules
        )
    assert all(r.startswith("# ") for r in rules)  # comments: the output stays pasteable
    _untouched(host)


def test_bind_dry_run_of_a_device_already_on_vfio_says_so(host: SysfsTree) -> None:
    p = run("bind", "--dry-run", "--root", str(host.root), "0000:65:00.0")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "# 0000:65:00.0: already on vfio-pci: nothing to do\n"


def test_unbind_dry_run_without_a_record_says_what_the_kernel_will_do(host: SysfsTree) -> None:
    p = run("unbind", "--dry-run", "--root", str(host.root), "0000:65:00.0")
    assert p.returncode == 0, p.stderr
    first, *steps = p.stdout.splitlines()
    assert "back to no driver" not in p.stdout
    assert first.startswith("# 0000:65:00.0: no driver recorded for it")
    assert "drivers_probe lets the kernel bind the loaded driver that matches it" in first
    assert steps[-1].endswith("/sys/bus/pci/drivers_probe")


def test_list_o_name_prints_kubectl_names(host: SysfsTree) -> None:
    p = run("list", "--root", str(host.root), "-o", "name", "--vendor", "8086")
    assert p.returncode == 0, p.stderr
    names = p.stdout.split()
    assert "pci/0000:65:00.0" in names and all(n.startswith("pci/") for n in names)


@pytest.mark.parametrize("command", ["check", "bind --dry-run", "unbind --dry-run"])
def test_every_address_command_takes_the_name_form(host: SysfsTree, command: str) -> None:
    """`vfioctl bind $(vfioctl list -o name ...)` works: the names list prints are taken."""
    names = run("list", "--root", str(host.root), "-o", "name", "--driver", "vfio-pci").stdout
    assert names.split() == ["pci/0000:65:00.0"]
    p = run(*command.split(), "--root", str(host.root), "-o", "name", *names.split())
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["pci/0000:65:00.0"]


def test_sriov_set_takes_the_name_form(host: SysfsTree) -> None:
    plain = run("sriov", "--root", str(host.root), "set", "--dry-run", "0000:af:00.0", "2")
    named = run("sriov", "--root", str(host.root), "set", "--dry-run", "pci/0000:af:00.0", "2")
    assert (named.returncode, named.stdout) == (plain.returncode, plain.stdout), named.stderr
    assert "is not a PCI address" not in named.stderr


def test_a_wrong_kind_is_still_refused(host: SysfsTree) -> None:
    p = run("check", "--root", str(host.root), "node/0000:65:00.0")
    assert p.returncode == 2 and "is not a PCI address" in p.stderr
