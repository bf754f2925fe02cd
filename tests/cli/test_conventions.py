"""The conventions people bring from kubectl, driverctl and dpdk-devbind (issue 21 item 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.sysfs_tree import Dev, SysfsTree

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VFIOCTL, *args], capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, **(env or {})})  # fmt: skip


@pytest.fixture
def root(tmp_path: Path) -> str:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:65:00.0", "8086", "10d3", "020000", driver="vfio-pci", group=7))
    t.add(Dev("0000:66:00.0", "8086", "10d3", "020000", driver="e1000e", group=8))
    t.add(Dev("0000:3b:00.0", "10de", "1eb8", "030200", driver="vfio-pci", group=45))
    return str(tmp_path)


def test_output_formats_agree(root: str) -> None:
    as_json = json.loads(_run("list", "--root", root, "-o", "json").stdout)
    assert yaml.safe_load(_run("list", "--root", root, "-o", "yaml").stdout) == as_json
    names = _run("list", "--root", root, "-o", "name").stdout.split()
    # kubectl's type/name (issue 38.4): what every address-taking command accepts back
    assert names == [f"pci/{d['address']}" for d in as_json] and len(names) == 3
    groups = _run("groups", "--root", root, "--no-probe", "-o", "name").stdout.split()
    assert sorted(groups, key=int) == ["7", "8", "45"]


def test_no_headers_and_the_serving_columns_without_a_config(root: str) -> None:
    table = _run("list", "--root", root).stdout.splitlines()
    assert table[0].split()[:2] == ["ADDRESS", "IDS"]
    assert "RESOURCE" in table[0] and "DRA" in table[0]  # devices on vfio-pci are served
    bare = _run("list", "--root", root, "--no-headers").stdout.splitlines()
    assert bare == table[1:]


def test_filters(root: str) -> None:
    def addrs(*f: str) -> list[str]:
        return _run("list", "--root", root, "-o", "name", *f).stdout.split()

    assert addrs("--driver", "vfio-pci") == ["pci/0000:3b:00.0", "pci/0000:65:00.0"]
    assert addrs("--class", "0302") == ["pci/0000:3b:00.0"]
    assert addrs("--vendor", "8086", "--driver", "e1000e") == ["pci/0000:66:00.0"]


def test_check_takes_the_dra_device_names_list_prints(root: str) -> None:
    by_name = json.loads(_run("check", "--root", root, "-o", "json", "pci-0000-65-00-0").stdout)
    by_addr = json.loads(_run("check", "--root", root, "-o", "json", "0000:65:00.0").stdout)
    assert by_name == by_addr and by_name[0]["address"] == "0000:65:00.0"


def test_completion_and_version() -> None:
    script = _run("completion", "bash")
    assert script.returncode == 0 and "_VFIOCTL_COMPLETE" in script.stdout
    # the script really completes: ask it as bash would
    out = _run(
        env={"_VFIOCTL_COMPLETE": "bash_complete", "COMP_WORDS": "vfioctl li", "COMP_CWORD": "1"}
    )
    assert "plain,list" in out.stdout.splitlines()
    assert _run("--version").stdout.startswith("vfioctl, version ")


def test_a_table_is_cut_to_the_terminal() -> None:
    from cli.common import _fit

    assert _fit([10, 200, 30], 100) == [10, 56, 30]  # the widest column gives way
    assert sum(_fit([10, 200, 30], 100)) + 4 == 100
    assert _fit([10, 20], 100) == [10, 20]
