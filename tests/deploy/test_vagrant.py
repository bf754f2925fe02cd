"""The Vagrantfile validates, and its VM really has an IOMMU and the guest-rig devices."""

from __future__ import annotations

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


def _has_libvirt_plugin(vagrant: str) -> bool:
    out = subprocess.run(
        [vagrant, "plugin", "list"], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    return "vagrant-libvirt" in out


def _validate(vagrant: str, project: Path) -> subprocess.CompletedProcess[str]:
    # Without the vagrant-libvirt plugin (not installable offline), Vagrant cannot load the
    # libvirt provider's config class; --ignore-provider validates everything else (box,
    # synced folders, provisioners and the files they name). The provider block is then
    # checked by test_libvirt_domain_* below through a stand-in for Vagrant's config API.
    args = [vagrant, "validate"]
    env = {"VAGRANT_CHECKPOINT_DISABLE": "1", "PATH": "/usr/bin:/bin:/usr/local/bin"}
    if _has_libvirt_plugin(vagrant):
        env["VAGRANT_DEFAULT_PROVIDER"] = "libvirt"
    else:
        args.append("--ignore-provider")
    env["HOME"] = os.environ.get("HOME", "/root")
    return subprocess.run(
        args, cwd=project, capture_output=True, text=True, timeout=300, env=env, check=False
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


# ------------------------------------------------------------- the provider block, recorded


def _record(env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    ruby = _tool("ruby")
    stub = Path(__file__).with_name("vagrant_stub.rb")
    proc = subprocess.run(
        [ruby, str(stub), str(VAGRANTFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


def _provider(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    vm = next(c for c in calls if c.get("attr") == "vm")["block"]
    (prov,) = [c for c in vm if c.get("call") == "provider" and c["args"] == ["libvirt"]]
    return list(prov["block"])


def _settings(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {c["set"]: c["value"] for c in calls if "set" in c}


def test_libvirt_domain_is_q35_with_an_interrupt_remapping_iommu() -> None:
    prov = _provider(_record())
    assert _settings(prov)["machine_type"] == "q35"
    qemu = [c["kwargs"]["value"] for c in prov if c.get("call") == "qemuargs"]
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


def test_provisioning_stages() -> None:
    calls = _record({"VFIO_DP_KUBEVIRT": "1"})
    vm = next(c for c in calls if c.get("attr") == "vm")["block"]
    provs = [c for c in vm if c.get("call") == "provision"]
    names = [c["args"][0] for c in provs]
    assert names == ["iommu", "kubernetes", "toolkit", "kubevirt"]
    assert provs[0]["kwargs"]["reboot"] is True, "the IOMMU kernel args need a reboot"
    assert all(c["kwargs"]["env"]["WITH_KUBEVIRT"] == "1" for c in provs)
    text = PROVISION.read_text()
    for name in names:
        assert f"  {name}) stage_{name} ;;" in text
    assert "intel_iommu=on iommu=pt" in text
    assert 'pip install "$SRC"' in text, "the toolkit is installed from the checkout"
    assert "overlays/vagrant" in text
    for entry in ("pciVendorSelector", "resourceName", "externalResourceProvider: true"):
        assert entry in text


def test_provision_script_parses() -> None:
    subprocess.run(["bash", "-n", str(PROVISION)], check=True)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed: bash -n passed, no lint run")
    subprocess.run([shellcheck, "-S", "warning", str(PROVISION)], check=True)
