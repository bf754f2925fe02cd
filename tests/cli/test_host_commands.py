"""vfioctl list/groups/bind/unbind/check as a user runs them: real processes, temp trees.

Binding here uses `--dry-run` or refusals only: a real write to a temp tree would not be
acted on (no kernel behind it); the bind logic itself is tested with the kernel simulator
(tests/host/test_bind.py) and on the real kernel (tests/guest/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.sysfs_tree import Dev, SysfsTree

if TYPE_CHECKING:
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.config import Selector
    from vfio_dp.model.device import Inventory, PciDevice

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    e.update(env or {})
    return subprocess.run([*VFIOCTL, *args], capture_output=True, text=True, env=e, timeout=60)


def test_list_json_fields(tree: SysfsTree) -> None:
    p = run("list", "--root", str(tree.root), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    gpu = rows["0000:3b:00.0"]
    assert gpu["vendor"] == "10de" and gpu["device"] == "1eb8" and gpu["class"] == "030200"
    assert gpu["driver"] == "nvidia" and gpu["iommu_group"] == 45 and gpu["numa_node"] == 0
    assert gpu["in_use"] == []
    # without --config: exactly what a process without one serves — vfio-pci devices only
    assert gpu["resource"] is None and gpu["dra_device"] is None and gpu["path"] is None
    nic = rows["0000:65:00.0"]
    assert nic["resource"] == "devices.kubevirt.io/8086_10d3" and nic["path"] == "devicePlugin"
    assert nic["dra_device"] == "pci-0000-65-00-0"
    assert rows["0000:00:00.0"]["resource"] is None  # a host bridge is never served
    assert rows["0000:00:00.0"]["numa_node"] is None and rows["0000:00:1f.0"]["driver"] is None
    assert any("mounted" in r for r in rows["0000:00:02.0"]["in_use"])
    # names come from this machine's pci.ids (load_names itself: tests/host/test_pciids.py)
    from vfio_dp.host.pciids import find_pci_ids

    if find_pci_ids() is not None:
        assert gpu["vendor_name"] == "NVIDIA Corporation"
        assert rows["0000:00:03.0"]["vendor_name"] == "Red Hat, Inc."
    else:  # no database: no names, never made-up ones
        assert all(r["vendor_name"] is None and r["device_name"] is None for r in rows.values())


def test_root_from_env_and_config_names(tree: SysfsTree, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text('selectors: [{vendor: "10de", resourceName: gpu.example.com/t4}]\n')
    p = run("list", "-o", "json", env={"VFIOCTL_ROOT": str(tree.root), "VFIOCTL_CONFIG": str(cfg)})
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert rows["0000:3b:00.0"]["resource"] == "gpu.example.com/t4"
    assert rows["0000:3b:00.0"]["dra_device"] is None  # a devicePlugin selector's device
    assert rows["0000:65:00.0"]["resource"] is None  # no selector takes the NIC


SPLIT_CONFIG = """
selectors:
  - vendor: "10de"
    device: "1eb8"
    bind: true
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "10d3"
    path: dra
  - vendor: "15b3"
    device: "101c"
    resourceName: vf
"""


def test_list_table_with_a_config_has_one_column_per_path(tree: SysfsTree, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(SPLIT_CONFIG)
    p = run("list", "--root", str(tree.root), "--config", str(cfg))
    assert p.returncode == 0, p.stderr
    head, *lines = p.stdout.splitlines()
    assert head.split()[-9:] == [
        "RESOURCE",
        "SERVED",
        "BY",
        "DRA",
        "DEVICE",
        "DRA",
        "HEALTH",
        "NOT",
        "SERVED",
    ]
    line = {ln.split()[0]: ln for ln in lines}
    assert line["0000:65:00.0"].split()[-3:-1] == ["pci-0000-65-00-0", "HEALTHY"]
    assert "devices.kubevirt.io/vf" in line["0000:af:00.1"]
    assert "pci-0000-65-00-0" in line["0000:65:00.0"]
    assert "split between paths" in line["0000:3b:00.1"]
    j = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    rows = {r["address"]: r for r in json.loads(j.stdout)}
    assert rows["0000:65:00.0"]["path"] == "dra" and rows["0000:65:00.0"]["resource"] is None
    assert rows["0000:3b:00.1"]["dra_device"] is None
    assert (
        rows["0000:65:00.0"]["dra_health"] == "HEALTHY"
        and rows["0000:65:00.0"]["dra_taint"] is None
    )
    assert rows["0000:3b:00.0"]["path"] == "devicePlugin"
    assert "IOMMU group 45 is split between paths" in rows["0000:3b:00.0"]["not_served"]
    assert rows["0000:af:00.0"]["path"] is None and rows["0000:af:00.0"]["resource"] is None


def test_groups_say_why_a_split_group_is_served_by_neither(tree: SysfsTree, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(SPLIT_CONFIG)
    p = run("groups", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    assert p.returncode == 0, p.stderr
    groups = {g["group"]: g for g in json.loads(p.stdout)}
    assert groups[45]["paths"] == {"0000:3b:00.0": "devicePlugin", "0000:3b:00.1": "dra"}
    assert "give its endpoints' selectors the same path" in groups[45]["not_served"]
    assert groups[50]["paths"] == {"0000:65:00.0": "dra"} and groups[50]["not_served"] is None
    t = run("groups", "--root", str(tree.root), "--config", str(cfg), "--no-probe")
    line45 = next(ln for ln in t.stdout.splitlines() if ln.startswith("45 "))
    assert "SPLIT" in line45 and "split between paths" in line45


def test_groups_json(tree: SysfsTree) -> None:
    p = run("groups", "--root", str(tree.root), "-o", "json")
    assert p.returncode == 0, p.stderr
    groups = {g["group"]: g for g in json.loads(p.stdout)}
    assert groups[45]["viable"] is False
    assert {x["address"] for x in groups[45]["problems"]} == {"0000:3b:00.0", "0000:3b:00.1"}
    assert groups[50]["viable"] is True
    # /dev/vfio/50 in a temp tree is a plain file: the kernel's verdict is unknown, not faked
    assert groups[50]["kernel_viable"] is None and groups[50]["in_use"] is False
    assert groups[45]["kernel_viable"] is None and groups[45]["in_use"] is None


def test_groups_without_iommu(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path, iommu=False)
    t.add(Dev("0000:01:00.0", "8086", "10d3", "020000", driver="e1000e", group=1))
    p = run("groups", "--root", str(t.root), "-o", "json")
    assert p.returncode == 0 and json.loads(p.stdout) == []
    assert "no IOMMU groups" in p.stderr and "intel_iommu=on" in p.stderr


@pytest.mark.parametrize("bad", ["../", "/sys/bus/pci/devices/0000:01:00.0", "0000:01:*.0"])
def test_bad_address_is_usage_error(tree: SysfsTree, bad: str) -> None:
    p = run("bind", "--root", str(tree.root), bad)
    assert p.returncode == 2 and repr(bad) in p.stderr and "DDDD:BB:SS.F" in p.stderr


def test_bind_refusals_exit_1_and_touch_nothing(tree: SysfsTree) -> None:
    before = tree.override_of("0000:3b:00.0")
    p = run("bind", "--root", str(tree.root), "0000:3b:00.0")
    assert p.returncode == 1
    assert "vfioctl bind --group 0000:3b:00.0" in p.stderr
    p = run("bind", "--root", str(tree.root), "0000:00:03.0")
    assert p.returncode == 1 and "eth0 is up" in p.stderr and "only interface" in p.stderr
    assert "--force" not in p.stderr  # the host's only interface: --force is never suggested
    assert tree.override_of("0000:3b:00.0") == before
    assert not (tree.root / "var/lib/vfio_dp/original").exists()


def test_bind_dry_run_json(tree: SysfsTree) -> None:
    p = run("bind", "--root", str(tree.root), "--group", "--dry-run", "-o", "json", "3b:00.0")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["dry_run"] is True and len(out["steps"]) == 6
    assert out["steps"][1].endswith("/sys/bus/pci/drivers/nvidia/unbind")


def test_bind_refuses_a_parent_the_configs_mdev_entries_want(
    tree: SysfsTree, tmp_path: Path
) -> None:
    """`vfioctl bind --config` (or VFIOCTL_CONFIG): a parent an `mdev:` entry names stays on
    its vendor driver, even in a dry run; the message names the entry and the fix."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mdev:\n- {parent: '0000:3b:00.0', type: nvidia-222, count: 2}\n")
    p = run("bind", "--root", str(tree.root), "--group", "--dry-run", "--config", str(cfg),
            "0000:3b:00.0")  # fmt: skip
    assert p.returncode == 1, p.stdout
    assert (
        "0000:3b:00.0 (10de:1eb8, nvidia) is the parent of the config's mdev entry "
        "{parent: 0000:3b:00.0, type: nvidia-222, path: devicePlugin}" in p.stderr
    )
    assert "remove that entry from the config's mdev: section" in p.stderr
    p = run("bind", "--root", str(tree.root), "--group", "--dry-run", "0000:3b:00.1",
            env={"VFIOCTL_CONFIG": str(cfg)})  # fmt: skip
    assert p.returncode == 1 and "is the parent of the config's mdev entry" in p.stderr
    # without a config the same dry run is planned
    p = run("bind", "--root", str(tree.root), "--group", "--dry-run", "0000:3b:00.0")
    assert p.returncode == 0, p.stderr


def test_bind_already_bound_is_noop(tree: SysfsTree) -> None:
    p = run("bind", "--root", str(tree.root), "0000:65:00.0")
    assert p.returncode == 0 and "already on vfio-pci" in p.stdout


def test_unknown_device(tree: SysfsTree) -> None:
    p = run("check", "--root", str(tree.root), "0000:99:00.0")
    assert p.returncode == 1 and "no PCI device 0000:99:00.0" in p.stderr


def test_check(tree: SysfsTree) -> None:
    p = run("check", "--root", str(tree.root), "-o", "json", "0000:65:00.0", "0000:3b:00.0")
    assert p.returncode == 1
    rep = {r["address"]: r for r in json.loads(p.stdout)}
    assert rep["0000:65:00.0"]["ready"] is True
    assert not rep["0000:3b:00.0"]["ready"]
    assert any("vfioctl bind --group 0000:3b:00.0" in r for r in rep["0000:3b:00.0"]["reasons"])
    p = run("check", "--root", str(tree.root), "0000:65:00.0")
    assert p.returncode == 0 and "ready" in p.stdout


def _loaded_after(tree: SysfsTree, cmd: list[str], modules: tuple[str, ...]) -> str:
    """Run ``vfioctl <cmd> --root <tree>`` in a fresh interpreter; return its stderr, which
    ends with ``LOADED [...]``: which of ``modules`` the command imported."""
    code = (
        "import sys; from cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', [m for m in {modules!r} if m in sys.modules], file=sys.stderr)\n"
    )
    e = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    p = subprocess.run(
        [sys.executable, "-c", code, *cmd, "--root", str(tree.root)],
        capture_output=True,
        text=True,
        env=e,
        timeout=60,
    )
    return p.stderr


def test_list_is_import_light(tree: SysfsTree) -> None:
    heavy = ("grpc", "kubernetes", "libvirt", "aiohttp", "google.protobuf", "cli.vm_cmds",
             "cli.deviceplugin_cmd", "vm_translate", "yaml")  # fmt: skip
    for cmd in (["list"], ["groups"], ["bind", "--dry-run", "0000:03:01.0", "--group"]):
        err = _loaded_after(tree, cmd, heavy)
        assert "LOADED []" in err, (cmd, err)


def test_unbind_does_not_load_host_usage(tree: SysfsTree) -> None:
    """Restoring is the path driverctl is timed against in the guest (bench/compare_tools.py).
    The planner (vfio_dp.model.plan) now holds unbind's own decisions, so unbind loads it
    (~1 ms here); host usage (which walks every interface and disk) it must never load."""
    err = _loaded_after(
        tree, ["unbind", "--dry-run", "0000:65:00.0"], ("vfio_dp.host.usage", "vfio_dp.host.pciids")
    )
    assert "LOADED []" in err, err


def _check(tree: SysfsTree, addr: str) -> list[str]:
    p = run("check", "--root", str(tree.root), "-o", "json", addr)
    assert p.returncode == 1, p.stderr
    (rep,) = json.loads(p.stdout)
    assert rep["ready"] is False
    return list(rep["reasons"])


def test_check_names_the_real_fix_for_a_mounted_boot_disk(tree: SysfsTree) -> None:
    reasons = _check(tree, "0000:00:02.0")
    assert any(
        "vda1 is mounted at / (the host's root filesystem)" in r and "pick another device" in r
        for r in reasons
    ), reasons
    # the host's root disk: never a bind hint, never --force (issue 21 item 8)
    assert not any("vfioctl bind" in r or "--force" in r for r in reasons), reasons
    assert any("must stay the host's" in r for r in reasons), reasons


def test_check_warns_that_the_only_interface_up_is_the_hosts_network(tree: SysfsTree) -> None:
    reasons = _check(tree, "0000:00:03.0")
    assert any("eth0 is up" in r and "only interface that is up" in r for r in reasons), reasons
    # the host's only interface: never a bind hint, never --force
    assert not any("vfioctl bind" in r or "--force" in r for r in reasons), reasons


def test_check_says_a_bridge_cannot_be_passed_through(tree: SysfsTree) -> None:
    for addr, kind in (("0000:00:00.0", "host bridge"), ("0000:00:1c.0", "PCI bridge")):
        reasons = _check(tree, addr)
        assert any(kind in r for r in reasons), reasons
        assert not any("vfioctl bind" in r for r in reasons), reasons


def test_check_free_device_is_told_to_bind(tree: SysfsTree) -> None:
    """A device the host does not use: binding it IS the fix, without --force."""
    reasons = _check(tree, "0000:af:00.1")  # an SR-IOV VF on mlx5_core, alone in its group
    assert any(r.endswith("fix: vfioctl bind 0000:af:00.1") for r in reasons), reasons
    assert not any("--force" in r for r in reasons), reasons


def test_bind_of_the_host_bridge_is_refused(tree: SysfsTree) -> None:
    p = run("bind", "--root", str(tree.root), "--dry-run", "0000:00:00.0")
    assert p.returncode == 1 and "host bridge" in p.stderr and "cannot be passed" in p.stderr


def test_unbind_all_argument_rules(tree: SysfsTree) -> None:
    p = run("unbind", "--root", str(tree.root), "--all", "0000:65:00.0")
    assert p.returncode == 2 and "--all or addresses" in p.stderr
    p = run("unbind", "--root", str(tree.root), "--all", "--driver", "e1000e")
    assert p.returncode == 2 and "drop --driver" in p.stderr
    p = run("unbind", "--root", str(tree.root), "--all")
    assert p.returncode == 0 and "nothing to restore" in p.stdout, p.stderr
    p = run("unbind", "--root", str(tree.root), "--all", "-o", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["restored"] == []


def test_unbind_all_dry_run_lists_every_recorded_device(tree: SysfsTree) -> None:
    """Records written as ``bind`` writes them; the dry run prints each device's restore."""
    state = tree.root / "var/lib/vfio_dp/original"
    state.mkdir(parents=True)
    rec = {"address": "0000:65:00.0", "driver": "e1000e", "driver_override": None,
           "vendor": "8086", "device": "10d3"}  # fmt: skip
    (state / "0000:65:00.0.json").write_text(json.dumps(rec))
    tree.ensure_driver("e1000e")
    p = run("unbind", "--root", str(tree.root), "--all", "--dry-run", "-o", "json")
    assert p.returncode == 0, p.stderr
    steps = json.loads(p.stdout)["steps"]
    assert steps[-1].endswith("/sys/bus/pci/drivers/e1000e/bind") and "0000:65:00.0" in steps[-1]
    assert (state / "0000:65:00.0.json").exists()  # a dry run changes nothing


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (None, "aliases"),  # billion laughs
        (
            b"x: &x {vendor: zz, device: yy}\nselectors: [" + b",".join([b"*x"] * 3000) + b"]\n",
            "more problems",
        ),
        (b"selectors: " + b"[" * 2000 + b"]" * 2000, "nested deeper"),
        (b"selectors:\n- resourceName: ger\xe4t\n", "not UTF-8"),
        (b"selectors:\n- vendor: 8086\n", 'vendor: "8086"'),
    ],
)
def test_list_with_a_hostile_config_is_a_usage_error_with_bounded_output(
    tree: SysfsTree, tmp_path: Path, content: bytes | None, expect: str
) -> None:
    from tests.model.test_config import BILLION_LAUGHS

    cfg = tmp_path / "cm.yaml"
    cfg.write_bytes(content if content is not None else BILLION_LAUGHS.encode())
    p = run("list", "--root", str(tree.root), "--config", str(cfg))
    assert p.returncode == 2, p.stderr[:2000]
    assert expect in p.stderr and str(cfg) in p.stderr
    assert len(p.stderr) < 5000 and "Traceback" not in p.stderr and p.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["groups"],
        ["check", "0000:65:00.0"],
        ["bind", "0000:65:00.0"],
        ["unbind", "0000:65:00.0"],
        ["plugin", "--metrics-port", "0"],
    ],
)
def test_a_root_that_does_not_exist_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "no-such-root"
    p = run(*args, "--root", str(missing))
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert str(missing) in p.stderr and "not a directory" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_list_skips_a_device_with_garbage_and_says_why(tree: SysfsTree) -> None:
    d = tree.dev_dir("0000:65:00.0")
    (d / "uevent").write_bytes(
        b"PCI_CLASS=20000\nPCI_ID=\x00\x00\x00\x00:10D3\nPCI_SUBSYS_ID=0:0\n"
    )
    p = run("list", "--root", str(tree.root), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert "0000:65:00.0" not in rows and "0000:3b:00.0" in rows
    assert not any("\x00" in (r["resource"] or "") for r in rows.values())
    assert "0000:65:00.0/uevent" in p.stderr and "skipped" in p.stderr


def test_groups_show_the_taint_of_a_prepared_group_gone_bad(
    tree: SysfsTree, tmp_path: Path
) -> None:
    """A claim holds the NIC's group (checkpoint); the NIC is off vfio-pci: the DRA plugin
    keeps it published with a NoSchedule taint, and vfioctl says so."""
    from vfio_dp.dra.claimpath.checkpoint import PREPARED, Checkpoint, ClaimRecord, DeviceRecord
    from vfio_dp.host.root import Root

    driver = "vfio.dra.vfio-dp.io"
    cfg = tmp_path / "c.yaml"
    cfg.write_text('selectors: [{vendor: "8086", device: "10d3", path: dra}]\n')
    group = json.loads(run("list", "--root", str(tree.root), "-o", "json").stdout)
    group_of = {r["address"]: r["iommu_group"] for r in group}["0000:65:00.0"]
    Checkpoint(Root(str(tree.root)), driver).put(
        ClaimRecord("vms", "vm-nic", "u1", PREPARED, "", None, (
            DeviceRecord(("nic",), "node-a", "pci-0000-65-00-0", group_of, ("0000:65:00.0",),
                         ("8086:10d3",)),))
    )  # fmt: skip
    healthy = run(
        "groups", "--root", str(tree.root), "--config", str(cfg), "--no-probe", "-o", "json"
    )
    (g,) = [r for r in json.loads(healthy.stdout) if r["group"] == group_of]
    assert g["dra_health"] == "HEALTHY" and g["dra_taint"] is None
    tree.set_driver("0000:65:00.0", "e1000e")
    p = run("groups", "--root", str(tree.root), "--config", str(cfg), "--no-probe")
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.split()[0] == str(group_of)]
    assert line.endswith("UNHEALTHY, tainted host-driver:NoSchedule")
    j = run("groups", "--root", str(tree.root), "--config", str(cfg), "--no-probe", "-o", "json")
    (g,) = [r for r in json.loads(j.stdout) if r["group"] == group_of]
    assert g["dra_device"] == "pci-0000-65-00-0" and g["dra_health"] == "UNHEALTHY"
    assert (
        g["dra_taint"]["key"] == f"{driver}/unhealthy" and g["dra_taint"]["effect"] == "NoSchedule"
    )
    assert "left vfio-pci for host driver e1000e" in g["dra_message"]


def test_list_reads_the_dra_checkpoint_only_when_there_is_one(tmp_path: Path) -> None:
    """Nothing on the DRA path: no checkpoint, nothing said; a checkpoint that does not parse,
    or a state dir that links out of the root, is still reported (the check for the file
    looks inside the root only, and hands anything it cannot tell to the reader)."""
    t = SysfsTree(tmp_path / "root")
    t.add(Dev("0000:00:1f.6", "8086", "15bb", "020000", driver="e1000e", group=1))
    ok = run("list", "--root", str(t.root), "-o", "json")
    assert ok.returncode == 0 and "checkpoint" not in ok.stderr, ok.stderr
    state = t.root / "var/lib/vfio_dp"
    state.mkdir(parents=True)
    (state / "dra-vfio.dra.vfio-dp.io.checkpoint.json").write_text("{not json")
    bad = run("list", "--root", str(t.root), "-o", "json")
    assert bad.returncode == 0, bad.stderr
    assert "the DRA checkpoint" in bad.stderr and "prepared claims not shown" in bad.stderr
    (state / "dra-vfio.dra.vfio-dp.io.checkpoint.json").unlink()
    state.rmdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dra-vfio.dra.vfio-dp.io.checkpoint.json").write_text("{}")
    state.symlink_to(outside)
    esc = run("list", "--root", str(t.root), "-o", "json")
    assert esc.returncode == 0, esc.stderr
    assert "cannot read the DRA checkpoint" in esc.stderr, esc.stderr


def test_check_reads_the_devices_groups_once(
    tree: SysfsTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readiness and the native device nodes come from one read of the groups (a second
    one cost `vfioctl check` ~15 system calls and the Python around them)."""
    from click.testing import CliRunner

    from cli.main import vfioctl
    from vfio_dp.host.host import Host

    reads: list[int] = []
    real = Host.scan_groups

    def counted(self: Host, addresses: Iterable[PciAddress], *, usage: bool = True) -> Inventory:
        reads.append(1)
        return real(self, addresses, usage=usage)

    monkeypatch.setattr(Host, "scan_groups", counted)
    res = CliRunner().invoke(vfioctl, ["check", "--root", str(tree.root), "0000:65:00.0"])
    assert res.exit_code == 0, res.output
    assert "0000:65:00.0: ready" in res.output and "device nodes" in res.output
    assert len(reads) == 1


def test_list_matches_each_device_against_the_selectors_once(
    tree: SysfsTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serving columns and the vfioDriver a bind would use come from one selector match
    per device (a second match per device for ``vfioDriver`` cost ``list -o json`` on 4,160
    functions ~4,000 more matches)."""
    from click.testing import CliRunner

    from cli.main import vfioctl
    from vfio_dp.model.config import Config

    matched: list[str] = []
    real = Config.select

    def counted(self: Config, dev: PciDevice) -> Selector | None:
        matched.append(str(dev.address))
        return real(self, dev)

    monkeypatch.setattr(Config, "select", counted)
    res = CliRunner().invoke(vfioctl, ["list", "--root", str(tree.root), "-o", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert any(r["vfioDriver"] for r in rows) and any(r["resource"] for r in rows)
    assert sorted(matched) == sorted({*matched}), "a device matched twice"
