"""The Vagrantfile validates, and its VM really has an IOMMU and the guest-rig devices."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import REPO

VAGRANTFILE = REPO / "Vagrantfile"
PROVISION = REPO / "deploy/vagrant/provision.sh"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package {name!r}); cannot check here")
    return path


def _copy_project(tmp: Path, with_provision: bool = True) -> Path:
    """Vagrantfile + the files it references, in a temp dir (validate writes .vagrant/)."""
    (tmp / "deploy/vagrant").mkdir(parents=True)
    shutil.copy(VAGRANTFILE, tmp / "Vagrantfile")
    if with_provision:
        shutil.copy(PROVISION, tmp / "deploy/vagrant/provision.sh")
    return tmp


@functools.cache
def _plugins(vagrant: str) -> str:
    """`vagrant plugin list`, asked once per session (~1.2 s of CPU each time: Ruby and
    Vagrant's start-up); the installed plugins do not change while the tests run."""
    return subprocess.run(
        [vagrant, "plugin", "list"], capture_output=True, text=True, timeout=120, check=False
    ).stdout


def _require_libvirt_plugin(vagrant: str) -> None:
    if "vagrant-libvirt" not in _plugins(vagrant):
        pytest.fail(
            "the vagrant-libvirt plugin is missing: apt-get install vagrant-libvirt "
            "(scripts/setup.sh installs it)",
            pytrace=False,
        )


def _env() -> dict[str, str]:
    return {
        "VAGRANT_CHECKPOINT_DISABLE": "1",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": os.environ.get("HOME", "/root"),
    }


def _validate(vagrant: str, project: Path) -> subprocess.CompletedProcess[str]:
    """Plain `vagrant validate`, the libvirt provider's own checks included (real plugin)."""
    _require_libvirt_plugin(vagrant)
    return subprocess.run(
        [vagrant, "validate"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        check=False,
    )


def test_vagrant_validate(tmp_path: Path) -> None:
    vagrant = _tool("vagrant")
    proc = _validate(vagrant, _copy_project(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout


def test_vagrant_validate_can_fail(tmp_path: Path) -> None:
    vagrant = _tool("vagrant")
    proc = _validate(vagrant, _copy_project(tmp_path, with_provision=False))
    assert proc.returncode != 0
    assert "provision.sh" in proc.stdout + proc.stderr


# ------------------------------------------- the provider block, as real Vagrant loads it


def _config(tmp: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The Vagrantfile's libvirt settings and provisioners, loaded by real Vagrant and the real
    vagrant-libvirt config class (tests/deploy/vagrant_config.rb)."""
    vagrant = _tool("vagrant")
    _require_libvirt_plugin(vagrant)
    ruby = _tool("ruby")
    project = _copy_project(tmp)
    proc = subprocess.run(
        [ruby, str(Path(__file__).with_name("vagrant_config.rb")), str(project)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(), **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_libvirt_domain_is_q35_with_an_interrupt_remapping_iommu(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    assert cfg["provider"] == "libvirt"
    assert cfg["machine_type"] == "q35"
    assert cfg["nic_model_type"] == "virtio", "the VM's own NIC is never an e1000(e)"
    qemu = cfg["qemu_args"]
    pairs = list(zip(qemu[::2], qemu[1::2], strict=True))
    assert ("-device", "intel-iommu,intremap=on") in pairs
    # intremap under KVM needs the split irqchip (libvirt's <ioapic driver='qemu'/>).
    assert ("-machine", "kernel-irqchip=split") in pairs
    devices = [v for k, v in pairs if k == "-device"]
    iommu = devices.index("intel-iommu,intremap=on")

    def props(dev: str) -> tuple[str, dict[str, str]]:
        model, *rest = dev.split(",")
        return model, dict(p.split("=", 1) for p in rest)

    parsed = [props(d) for d in devices[iommu + 1 :]]
    ports = {p["id"] for m, p in parsed if m == "pcie-root-port"}
    e1000e_buses = [p["bus"] for m, p in parsed if m == "e1000e"]
    assert len(e1000e_buses) == 2 and len(set(e1000e_buses)) == 2, "each e1000e alone"
    assert set(e1000e_buses) <= ports
    bridges = {p["id"] for m, p in parsed if m == "pcie-pci-bridge"}
    e1000_buses = [p["bus"] for m, p in parsed if m == "e1000"]
    assert len(e1000_buses) == 2 and len(set(e1000_buses)) == 1, "two e1000 share a bridge"
    assert set(e1000_buses) <= bridges
    chassis = [p["chassis"] for m, p in parsed if m == "pcie-root-port"]
    assert len(chassis) == len(set(chassis))


def test_provisioning_stages(tmp_path: Path) -> None:
    provs = _config(tmp_path, {"VFIO_DP_KUBEVIRT": "1"})["provisioners"]
    names = [p["name"] for p in provs]
    assert names == ["iommu", "kubernetes", "toolkit", "kubevirt"]
    assert all(p["type"] == "shell" for p in provs)
    assert provs[0]["reboot"] is True, "the IOMMU kernel args need a reboot"
    assert all(p["env"]["WITH_KUBEVIRT"] == "1" for p in provs)
    text = PROVISION.read_text()
    for name in names:
        assert f"  {name}) stage_{name} ;;" in text
    assert "intel_iommu=on iommu=pt" in text
    assert 'pip install "$SRC"' in text, "the toolkit is installed from the checkout"
    assert "overlays/vagrant" in text
    for entry in ("pciVendorSelector", "resourceName", "externalResourceProvider: true"):
        assert entry in text


def _check(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_provision_script_parses_and_lints_clean(tmp_path: Path) -> None:
    """``bash -n`` and shellcheck (warnings and worse) pass on provision.sh, and each of them
    refuses a copy with a fault of its kind (so a pass means something)."""
    parsed = _check(["bash", "-n", str(PROVISION)])
    assert parsed.returncode == 0, parsed.stderr
    broken = tmp_path / "broken.sh"
    broken.write_text(PROVISION.read_text() + "\nif then fi\n")
    parsed = _check(["bash", "-n", str(broken)])
    assert parsed.returncode != 0 and "syntax error" in parsed.stderr, parsed.stderr

    shellcheck = _tool("shellcheck")
    lint = _check([shellcheck, "-S", "warning", str(PROVISION)])
    assert lint.returncode == 0, lint.stdout + lint.stderr
    sloppy = tmp_path / "sloppy.sh"  # an unset variable would make this `rm -rf /`
    sloppy.write_text(PROVISION.read_text() + '\nrm -rf "$STAGE_DIR"/\n')
    lint = _check([shellcheck, "-S", "warning", str(sloppy)])
    assert lint.returncode != 0 and "SC2115" in lint.stdout, lint.stdout + lint.stderr
