"""``vfioctl plugin --cdi-dir``: Allocate names CDI devices, one spec per advertised unit.

Over real unix sockets with the kubelet stand-in, on a temp sysfs tree and a temp CDI dir.
Each written spec is checked against the CDI spec's structure by :func:`check_cdi_spec`
(written here from cncf-tags/container-device-interface ``SPEC.md``, independent of
:mod:`vfio_dp.model.cdi`), and each ``cdi_devices`` ID must resolve to a device in a spec
file the way a runtime resolves it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from tests.deviceplugin.conftest import NIC, NIC_ID, StartDaemon
from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.deviceplugin.test_daemon import listed, renumber_group
from tests.deviceplugin.test_process import GRPCURL, PROTO, spawn
from tests.sysfs_tree import Dev, SysfsTree
from tests.waiting import wait_until_async
from vfio_dp.model import naming

NIC2 = "0000:66:00.0"
SPEC1 = "deviceplugin.vfio-dp.io_pci-0000-65-00-0.json"
SPEC2 = "deviceplugin.vfio-dp.io_pci-0000-66-00-0.json"
ID1 = "deviceplugin.vfio-dp.io/vfio=pci-0000-65-00-0"

# SPEC.md: vendor and class are of "A-Za-z0-9._-", starting with a letter; a device name allows
# also ':' and starts and ends alphanumerically.
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9._-]*/[A-Za-z][A-Za-z0-9._-]*")
_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_TOP = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
_EDITS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids"}
_NODE = {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
# podman 4.3 (the CDI consumer in the guest rig) accepts up to 0.5.0
_VERSIONS = {"0.3.0", "0.4.0", "0.5.0"}


def check_cdi_spec(spec: object) -> list[tuple[str, str]]:
    """Structural check of one spec file; returns its (kind, device name) pairs."""
    assert isinstance(spec, dict), spec
    assert set(spec) <= _TOP, f"unknown top-level keys {set(spec) - _TOP}"
    for key in ("cdiVersion", "kind", "devices"):
        assert key in spec, f"required key {key!r} missing"
    assert spec["cdiVersion"] in _VERSIONS, spec["cdiVersion"]
    assert isinstance(spec["kind"], str) and _KIND.fullmatch(spec["kind"]), spec["kind"]
    assert isinstance(spec["devices"], list) and spec["devices"], "a spec needs a device"
    names = []
    for dev in spec["devices"]:
        assert set(dev) <= {"name", "annotations", "containerEdits"}, dev
        assert isinstance(dev["name"], str) and _DEVICE.fullmatch(dev["name"]), dev
        edits = dev["containerEdits"]
        assert isinstance(edits, dict) and edits and set(edits) <= _EDITS, edits
        for node in edits.get("deviceNodes", []):
            assert set(node) <= _NODE and node["path"].startswith("/"), node
        names.append((spec["kind"], dev["name"]))
    assert len(set(names)) == len(names), "device names repeat"
    return names


def read_specs(cdi_dir: Path) -> dict[str, dict[str, object]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(cdi_dir.glob("*.json"))}


def resolve(cdi_dir: Path, device_id: str) -> list[str]:
    """What a runtime does with a ``cdi_devices`` name: find the one device of that kind and
    name among every spec file; its device node paths."""
    kind, _, name = device_id.partition("=")
    found = [
        dev
        for spec in read_specs(cdi_dir).values()
        if spec.get("kind") == kind
        for dev in spec["devices"]  # type: ignore[attr-defined]
        if dev["name"] == name
    ]
    assert len(found) == 1, f"{device_id} resolves to {len(found)} devices"
    return [n["path"] for n in found[0]["containerEdits"]["deviceNodes"]]


async def wait_files(cdi_dir: Path, names: set[str]) -> None:
    await wait_until_async(
        lambda: {p.name for p in cdi_dir.glob("deviceplugin*.json")} == names,
        what=f"the specs {sorted(names)} in {cdi_dir}",
        state=lambda: sorted(os.listdir(cdi_dir)),
    )


def add_nic2(tree: SysfsTree, *, cdev: bool) -> None:
    tree.add(
        Dev(NIC2, "8086", "10d3", "020000", driver="vfio-pci", group=66, parent="0000:00:1d.0")
    )
    if cdev:  # kernel >= 6.6: the VFIO cdev and iommufd
        (tree.dev_dir(NIC2) / "vfio-dev" / "vfio3").mkdir(parents=True)
        (tree.root / "dev/vfio/devices").mkdir(parents=True, exist_ok=True)
        (tree.root / "dev/vfio/devices/vfio3").write_text("")
        (tree.root / "dev/iommu").write_text("")


async def test_allocate_answers_cdi_devices_that_resolve_to_a_written_spec(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    (cdi_dir / "vfio.dra.vfio-dp.io-1234.json").write_text("{}")  # the DRA plugin's: not ours
    add_nic2(tree, cdev=True)
    await start_daemon(cdi_dir=cdi_dir)
    await kubelet.wait_for("NICs", listed(NIC, {NIC_ID: "Healthy", NIC2: "Healthy"}))
    await wait_files(cdi_dir, {SPEC1, SPEC2})
    specs = read_specs(cdi_dir)
    assert check_cdi_spec(specs[SPEC1]) == [("deviceplugin.vfio-dp.io/vfio", "pci-0000-65-00-0")]
    assert specs[SPEC1]["cdiVersion"] == "0.5.0"
    assert check_cdi_spec(specs[SPEC2]) == [("deviceplugin.vfio-dp.io/vfio", "pci-0000-66-00-0")]
    # the cdev and /dev/iommu only where the kernel has them
    assert resolve(cdi_dir, ID1) == ["/dev/vfio/vfio", "/dev/vfio/50"]
    assert resolve(cdi_dir, "deviceplugin.vfio-dp.io/vfio=pci-0000-66-00-0") == [
        "/dev/vfio/vfio",
        "/dev/vfio/66",
        "/dev/vfio/devices/vfio3",
        "/dev/iommu",
    ]

    resp = await kubelet.allocate(NIC, [NIC_ID])
    assert [c.name for c in resp.cdi_devices] == [ID1]
    # the env contract and the device nodes are unchanged
    assert dict(resp.envs) == {
        "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3": NIC_ID,
        "PCIDEVICE_DEVICES_KUBEVIRT_IO_8086_10D3": NIC_ID,
    }
    assert [d.host_path for d in resp.devices] == resolve(cdi_dir, ID1)
    both = await kubelet.allocate(NIC, [NIC_ID, NIC2])
    assert [c.name for c in both.cdi_devices] == [
        ID1,
        "deviceplugin.vfio-dp.io/vfio=pci-0000-66-00-0",
    ]
    assert (cdi_dir / "vfio.dra.vfio-dp.io-1234.json").read_text() == "{}"


async def test_one_spec_per_unit_rewritten_in_place_and_removed_with_its_unit(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    (cdi_dir / "other-vendor.json").write_text("{}")
    # a spec an earlier run left for a unit that no longer exists
    (cdi_dir / "deviceplugin.vfio-dp.io_pci-0000-99-00-0.json").write_text("{}")
    add_nic2(tree, cdev=False)
    daemon = await start_daemon(cdi_dir=cdi_dir)
    await kubelet.wait_for("NICs", listed(NIC, {NIC_ID: "Healthy", NIC2: "Healthy"}))
    await wait_files(cdi_dir, {SPEC1, SPEC2})
    inode = (cdi_dir / SPEC1).stat().st_ino
    for _ in range(20):  # no deallocate: repeated Allocates pile nothing up, rewrite nothing
        await kubelet.allocate(NIC, [NIC_ID])
    await wait_files(cdi_dir, {SPEC1, SPEC2})
    assert (cdi_dir / SPEC1).stat().st_ino == inode
    assert set(os.listdir(cdi_dir)) == {"other-vendor.json", SPEC1, SPEC2}  # no temp files

    tree.remove(NIC2)  # no longer advertised: its spec goes
    await kubelet.wait_for("NIC2 gone", listed(NIC, {NIC_ID: "Healthy"}))
    await wait_files(cdi_dir, {SPEC1})
    assert (cdi_dir / "other-vendor.json").read_text() == "{}"

    await daemon.stop()  # a "reboot" renumbers the group: the same file, rewritten in place
    renumber_group(tree, NIC_ID, 50, 51)
    await kubelet.restart()
    await start_daemon(cdi_dir=cdi_dir)
    await kubelet.wait_for("NIC after reboot", listed(NIC, {NIC_ID: "Healthy"}))
    await wait_until_async(
        lambda: resolve(cdi_dir, ID1) == ["/dev/vfio/vfio", "/dev/vfio/51"],
        what=f"{SPEC1} rewritten for group 51",
        state=lambda: resolve(cdi_dir, ID1),
    )
    await wait_files(cdi_dir, {SPEC1})


async def test_cdi_is_off_by_default(
    kubelet: KubeletStandin, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    resp = await kubelet.allocate(NIC, [NIC_ID])
    assert list(resp.cdi_devices) == []
    assert [d.host_path for d in resp.devices] == ["/dev/vfio/vfio", "/dev/vfio/50"]


async def test_an_unwritable_cdi_dir_fails_allocate_with_the_fix(
    kubelet: KubeletStandin, start_daemon: StartDaemon, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "cdi"
    not_a_dir.write_text("a file where the CDI dir goes")
    await start_daemon(cdi_dir=not_a_dir)
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))  # still serves
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate(NIC, [NIC_ID])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details() or ""
    assert str(not_a_dir) in details and "--cdi-dir" in details


async def test_a_go_client_reads_cdi_devices_from_the_real_process(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    """``vfioctl plugin`` as a subprocess with ``VFIOCTL_CDI_DIR``; grpcurl (Go's gRPC and
    protobuf, like the kubelet) decodes ``cdiDevices`` from Allocate; SIGTERM keeps the spec."""
    assert GRPCURL, "grpcurl is missing: run scripts/setup.sh (the test extra ships it)"
    cdi_dir = tmp_path / "cdi"
    os.environ["VFIOCTL_CDI_DIR"] = str(cdi_dir)
    try:
        proc = spawn(tree, kdir)
    finally:
        del os.environ["VFIOCTL_CDI_DIR"]
    sock = os.path.join(kdir, naming.socket_name(NIC))
    try:
        await kubelet.wait_for("registered", listed(NIC, {NIC_ID: "Healthy"}), timeout=15)
        await wait_files(cdi_dir, {SPEC1})
        body = json.dumps({"container_requests": [{"devices_ids": [NIC_ID]}]})
        out = await asyncio.to_thread(
            subprocess.run,
            [
                GRPCURL,
                "-plaintext",
                "-unix",
                "-import-path",
                str(PROTO.parent),
                "-proto",
                PROTO.name,
                "-d",
                body,
                sock,
                "v1beta1.DevicePlugin/Allocate",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert out.returncode == 0, out.stderr
        resp = json.loads(out.stdout)["containerResponses"][0]
        assert resp["cdiDevices"] == [{"name": ID1}]
        assert resp["envs"]["PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3"] == NIC_ID
        assert resolve(cdi_dir, ID1) == [d["hostPath"] for d in resp["devices"]]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
    assert (cdi_dir / SPEC1).exists()  # kept at stop: a container created meanwhile resolves it
