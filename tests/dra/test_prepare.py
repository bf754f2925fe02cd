"""NodePrepare/NodeUnprepareResources and reconcile (vfio_dp.dra.claimpath.prepare) on temp sysfs trees
with the kernel simulator (tests/kernel_sim.py); ResourceClaims from a dict-backed reader that
answers like the API server (None = 404), and in one test through the API-server stand-in and
the real kubernetes client."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.counting_host import CountingHost
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath import cdi
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.dra.claimpath.checkpoint import RELEASING, Checkpoint
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.dra.slices import Device
from vfio_dp.host import Host
from vfio_dp.host.bound_by import BOUND_BY_OPERATOR, bound_by_claim
from vfio_dp.model import dra_metadata as md
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config, load_config_text
from vfio_dp.model.dra_metadata import Attribute

DRIVER = "vfio.example.com"
NODE = "node-a"
GPU, AUDIO = "0000:3b:00.0", "0000:3b:00.1"
E1000_A, E1000_B = "0000:03:01.0", "0000:03:02.0"
LONE = "0000:65:00.0"  # on vfio-pci already, bind: false

CONFIG = """
selectors:
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "100e"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "10d3"
    path: dra
  - vendor: "1af4"
    device: "1000"
    path: dra
    bind: onPrepare
"""


class Claims:
    """ResourceClaims by (namespace, name), answered like the API server's GET."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.fail: Exception | None = None

    def add(
        self,
        name: str,
        uid: str,
        results: list[dict[str, Any]],
        *,
        namespace: str = "default",
        annotations: dict[str, str] | None = None,
        config: list[dict[str, Any]] | None = None,
    ) -> ClaimRef:
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            meta["annotations"] = annotations
        devices: dict[str, Any] = {"results": results}
        if config:
            devices["config"] = config
        self.objects[(namespace, name)] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": meta,
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": devices}},
        }
        return ClaimRef(namespace, uid, name)

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return self.objects.get((namespace, name))


def result(device: str, request: str = "nic", **kw: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **kw}


@pytest.fixture
def config() -> Config:
    return load_config_text(CONFIG, "test")


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "cdi"), str(tmp_path / "plugins")


def _boot(tree: SysfsTree, boot_id: str) -> None:
    p = tree.root / "proc/sys/kernel/random"
    p.mkdir(parents=True, exist_ok=True)
    (p / "boot_id").write_text(boot_id + "\n")


@pytest.fixture
def preparer(
    tree: SysfsTree, kernel: SimulatedKernel, config: Config, claims: Claims, dirs: tuple[str, str]
) -> ClaimPreparer:
    _boot(tree, "boot-1")
    return _preparer(tree, kernel, config, claims, dirs)


def _preparer(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
    **kw: Any,
) -> ClaimPreparer:
    return ClaimPreparer(
        host=Host(tree.root, kernel=kernel),
        driver=DRIVER,
        node=NODE,
        cdi_dir=dirs[0],
        plugins_dir=dirs[1],
        read_claim=claims.read,
        config=lambda: config,
        **kw,
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _record(tree: SysfsTree, addr: str) -> dict[str, Any] | None:
    p = tree.root / "var/lib/vfio_dp/original" / f"{addr}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _spec(dirs: tuple[str, str], uid: str) -> dict[str, Any] | None:
    return cdi.read_spec(dirs[0], DRIVER, uid)


# -- NodePrepareResources ------------------------------------------------------------------
def test_on_prepare_binds_the_whole_group_and_unprepare_gives_it_back(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    out = run(preparer.prepare([ref]))["uid-gpu"]
    assert out.error == ""
    assert tree.driver_of(GPU) == "vfio-pci" and tree.driver_of(AUDIO) == "vfio-pci"
    assert _record(tree, GPU)["bound_by"] == "claim:uid-gpu"  # type: ignore[index]
    assert _record(tree, AUDIO)["bound_by"] == "claim:uid-gpu"  # type: ignore[index]
    (dev,) = out.devices
    assert (dev.request_names, dev.pool_name, dev.device_name) == (
        ("gpu",),
        NODE,
        "pci-0000-3b-00-0",
    )
    assert dev.cdi_device_ids == (
        f"{DRIVER}/vfio=uid-gpu-pci-0000-3b-00-0",
        f"{DRIVER}/vfio=uid-gpu-metadata-gpu",
    )
    spec = _spec(dirs, "uid-gpu")
    assert spec is not None and spec["cdiVersion"] == "0.5.0" and spec["kind"] == f"{DRIVER}/vfio"
    group_dev, meta_dev = spec["devices"]
    assert group_dev["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/vfio/vfio"}, {"path": "/dev/vfio/45"}]
    }
    mount = meta_dev["containerEdits"]["mounts"][0]
    assert mount["containerPath"] == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/gpu/{DRIVER}-metadata.json"
    )
    assert mount["hostPath"] == (
        f"{dirs[1]}/{DRIVER}/dra-device-metadata/uid-gpu/gpu/{DRIVER}-metadata.json"
    )
    assert mount["options"] == ["ro", "bind"]
    meta = mdfile.read(mount["hostPath"])
    assert (meta.name, meta.namespace, meta.uid, meta.pod_claim_name) == (
        "vm-gpu",
        "default",
        "uid-gpu",
        None,
    )
    (mdev,) = meta.devices_for("gpu")
    assert mdev.pci_bus_id == GPU and mdev.pool == NODE and mdev.driver == DRIVER
    assert mdev.attributes["iommuGroup"] == md.Attribute("int", 45)
    assert "PCI_RESOURCE" not in json.dumps(spec)

    assert run(preparer.unprepare([ref])) == {"uid-gpu": ""}
    assert tree.driver_of(GPU) == "nvidia" and tree.driver_of(AUDIO) == "snd_hda_intel"
    assert _record(tree, GPU) is None and _spec(dirs, "uid-gpu") is None
    assert not os.path.exists(mount["hostPath"])
    assert preparer.checkpoint.get("uid-gpu") is None


def test_shared_group_is_one_device_and_both_endpoints_bind(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    out = run(preparer.prepare([ref]))["uid-nic"]
    assert out.error == ""
    assert tree.driver_of(E1000_A) == "vfio-pci" and tree.driver_of(E1000_B) == "vfio-pci"
    meta = mdfile.read(f"{dirs[1]}/{DRIVER}/dra-device-metadata/uid-nic/nic/{DRIVER}-metadata.json")
    (mdev,) = meta.devices_for("nic")
    assert mdev.attributes["groupFunctions"] == md.Attribute("string", E1000_B)
    run(preparer.unprepare([ref]))
    assert tree.driver_of(E1000_A) == "e1000" and tree.driver_of(E1000_B) == "e1000"


def test_operator_binding_is_never_undone(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims
) -> None:
    Host(tree.root, kernel=kernel).bind([PciAddress.parse(E1000_A)], group=True, probe=False)
    writes = len(kernel.writes)
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    assert run(preparer.prepare([ref]))["uid-nic"].error == ""
    assert len(kernel.writes) == writes  # nothing to bind
    assert run(preparer.unprepare([ref])) == {"uid-nic": ""}
    assert tree.driver_of(E1000_A) == "vfio-pci"  # the operator's binding stays
    assert _record(tree, E1000_A)["bound_by"] == BOUND_BY_OPERATOR  # type: ignore[index]


def test_a_prepare_reads_its_claims_groups_and_nothing_else(
    tree: SysfsTree, kernel: SimulatedKernel, config: Config, claims: Claims, dirs: tuple[str, str]
) -> None:
    _boot(tree, "boot-1")
    host = CountingHost(tree.root, kernel=kernel)
    p = ClaimPreparer(
        host=host, driver=DRIVER, node=NODE, cdi_dir=dirs[0], plugins_dir=dirs[1],
        read_claim=claims.read, config=lambda: config,
    )  # fmt: skip
    ref = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
    assert run(p.prepare([ref]))["uid-lone"].error == ""
    assert (host.scans, host.refreshes, host.group_reads) == (0, 0, [[LONE]])
    gpu = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    assert run(p.prepare([gpu]))["uid-gpu"].error == ""
    # the claim's group read once: the bind plans from it (and again under the locks from the
    # bound devices themselves), then only the bound group is re-read; nothing reads every
    # device
    assert (host.scans, host.refreshes, host.rereads) == (0, 0, 1)
    assert host.group_reads[1:] == [[GPU]]
    assert tree.driver_of(GPU) == "vfio-pci"
    again = run(p.prepare([gpu]))["uid-gpu"]
    assert again.error == "" and (host.scans, host.refreshes, host.rereads) == (0, 0, 1)
    assert host.group_reads[2:] == [[GPU]]


def test_bind_false_group_already_on_vfio(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims
) -> None:
    ref = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
    assert run(preparer.prepare([ref]))["uid-lone"].error == ""
    run(preparer.unprepare([ref]))
    assert tree.driver_of(LONE) == "vfio-pci"


def test_template_generated_claim_metadata_path(
    preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    ref = claims.add(
        "virt-launcher-vm-1-nic-x7k2p",
        "uid-t",
        [result("pci-0000-03-01-0", request="nic")],
        annotations={md.POD_CLAIM_NAME_ANNOTATION: "nic"},
    )
    assert run(preparer.prepare([ref]))["uid-t"].error == ""
    spec = _spec(dirs, "uid-t")
    assert spec is not None
    mount = spec["devices"][1]["containerEdits"]["mounts"][0]
    assert mount["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/nic/nic/"
        f"{DRIVER}-metadata.json"
    )
    assert mdfile.read(mount["hostPath"]).pod_claim_name == "nic"


def test_admin_access_never_binds_nor_gets_the_group(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    preparer: ClaimPreparer,
    claims: Claims,
    dirs: tuple[str, str],
) -> None:
    ref = claims.add(
        "mon", "uid-mon", [result("pci-0000-3b-00-0", request="gpu", adminAccess=True)]
    )
    out = run(preparer.prepare([ref]))["uid-mon"]
    assert out.error == ""
    assert kernel.writes == [] and tree.driver_of(GPU) == "nvidia"
    assert out.devices[0].cdi_device_ids == (f"{DRIVER}/vfio=uid-mon-metadata-gpu",)
    spec = _spec(dirs, "uid-mon")
    assert spec is not None and "/dev/vfio" not in json.dumps(spec)
    assert run(preparer.unprepare([ref])) == {"uid-mon": ""}
    assert kernel.writes == []


def test_idempotent_repeat_writes_nothing_to_the_kernel(
    kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims
) -> None:
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    first = run(preparer.prepare([ref]))
    writes = list(kernel.writes)
    again = run(preparer.prepare([ref]))
    assert again == first and kernel.writes == writes


def test_a_repeat_while_the_bind_runs_waits_and_answers_from_the_device_state(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims
) -> None:
    """kubelet's deadline expired during a slow unbind and it re-sent the claim: the second
    call waits for the first, binds nothing again, and gets the same answer."""
    import threading

    from tests.waiting import wait_until_async

    gate = kernel.gates["nvidia/unbind"] = threading.Event()  # the unbind ends when we say
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])

    async def both() -> list[Any]:
        first = asyncio.create_task(preparer.prepare([ref]))
        try:
            await wait_until_async(
                lambda: any(p.endswith("nvidia/unbind") for p, _ in kernel.writes),
                what="the first call inside its unbind",
            )
            second = asyncio.create_task(preparer.prepare([ref]))
            done, _ = await asyncio.wait({second}, timeout=0.2)  # a bounded look, not a sync
            assert not done, "the repeat answered while the first call was still binding"
        finally:
            gate.set()
        return list(await asyncio.gather(first, second))

    first, second = run(both())
    assert first == second and first["uid-gpu"].error == ""
    overrides = [d for p, d in kernel.writes if p.endswith(f"{GPU}/driver_override")]
    assert overrides == ["vfio-pci"]  # bound once
    assert tree.driver_of(GPU) == "vfio-pci"


def test_claims_of_one_call_are_answered_separately(
    preparer: ClaimPreparer, claims: Claims
) -> None:
    good = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    missing = ClaimRef("default", "uid-missing", "gone")
    out = run(preparer.prepare([good, missing]))
    assert out["uid-nic"].error == ""
    assert "default/gone (uid uid-missing)" in out["uid-missing"].error
    assert "does not exist" in out["uid-missing"].error


@pytest.mark.parametrize(
    ("results", "extra", "uid_seen", "expect"),
    [
        ([result("pci-0000-03-01-0")], {}, "other-uid", "now has uid 'other-uid'"),
        (
            [result("pci-0000-03-01-0", pool="node-b")],
            {},
            None,
            "pci-0000-03-01-0: allocated from pool 'node-b'",
        ),
        (
            [{**result("pci-0000-03-01-0"), "driver": "gpu.nvidia.com"}],
            {},
            None,
            "no device of driver vfio.example.com",
        ),
        (
            [result("pci-0000-99-00-0")],
            {},
            None,
            "device pci-0000-99-00-0: no such device on this node",
        ),
        (
            [result("pci-0000-03-01-0", request="../../etc")],
            {},
            None,
            "device pci-0000-03-01-0: request name '../../etc' is not a DNS label",
        ),
        (
            [result("pci-0000-00-03-0")],
            {},
            None,
            "device pci-0000-00-03-0: 0000:00:03.0 (1af4:1000, virtio-pci) is used by the host",
        ),
        (
            [result("pci-0000-03-01-0")],
            {
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": ["nic"],
                        "opaque": {"driver": DRIVER, "parameters": {"x": 1}},
                    }
                ]
            },
            None,
            "opaque configuration for driver vfio.example.com (requests nic) is not understood",
        ),
    ],
)
def test_per_claim_errors_name_claim_device_and_reason(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    preparer: ClaimPreparer,
    claims: Claims,
    results: list[dict[str, Any]],
    extra: dict[str, Any],
    uid_seen: str | None,
    expect: str,
) -> None:
    ref = claims.add("vm-x", uid_seen or "uid-x", results, **extra)
    asked = ClaimRef(ref.namespace, "uid-x", ref.name)
    err = run(preparer.prepare([asked]))["uid-x"].error
    assert err.startswith("claim default/vm-x (uid uid-x): ") and expect in err, err
    assert kernel.writes == []  # refused before anything was touched
    assert tree.driver_of("0000:00:03.0") == "virtio-pci"


def test_opaque_config_of_another_driver_is_not_ours_to_judge(
    preparer: ClaimPreparer, claims: Claims
) -> None:
    ref = claims.add(
        "vm-nic",
        "uid-nic",
        [result("pci-0000-03-01-0")],
        config=[{"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}],
    )
    assert run(preparer.prepare([ref]))["uid-nic"].error == ""


def test_api_server_unreachable_is_a_claim_error(preparer: ClaimPreparer, claims: Claims) -> None:
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    claims.fail = ConnectionRefusedError(111, "Connection refused")
    err = run(preparer.prepare([ref]))["uid-nic"].error
    assert "cannot read the ResourceClaim from the API server" in err


def test_bind_refusal_and_rollback_are_host_binds(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims
) -> None:
    """The audio function will not attach to vfio-pci: Host.bind rolls the group back and the
    claim's error names the device."""
    kernel.refuse_attach.add((AUDIO, "vfio-pci"))
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    err = run(preparer.prepare([ref]))["uid-gpu"].error
    assert "device pci-0000-3b-00-0: binding the IOMMU group to its VFIO driver failed" in err
    assert "rolled back" in err
    assert tree.driver_of(GPU) == "nvidia" and tree.driver_of(AUDIO) == "snd_hda_intel"
    assert _record(tree, GPU) is None


def test_published_group_number_must_match(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
) -> None:
    published = {
        "pci-0000-03-01-0": Device("pci-0000-03-01-0", {"iommuGroup": Attribute("int", 6)})
    }
    p = _preparer(tree, kernel, config, claims, dirs, published=lambda: published)
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    err = run(p.prepare([ref]))["uid-nic"].error
    assert "published as IOMMU group 6 but it is group 7 now" in err
    published["pci-0000-03-01-0"] = Device("pci-0000-03-01-0", {"iommuGroup": Attribute("int", 7)})
    assert run(p.prepare([ref]))["uid-nic"].error == ""


# -- NodeUnprepareResources ----------------------------------------------------------------
def test_unprepare_answers_unknown_claims(preparer: ClaimPreparer) -> None:
    refs = [ClaimRef("default", "uid-a", "a"), ClaimRef("other", "uid-b", "b")]
    assert run(preparer.unprepare(refs)) == {"uid-a": "", "uid-b": ""}


def _hold(tree: SysfsTree, pid: int, node: str) -> None:
    d = tree.root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text("qemu-kvm\n")
    (d / "fd" / "31").symlink_to(node)


def test_unprepare_keeps_a_held_group_and_reconcile_gives_it_back_later(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    run(preparer.prepare([ref]))
    _hold(tree, 4242, "/dev/vfio/45")
    err = run(preparer.unprepare([ref]))["uid-gpu"]
    assert "IOMMU group 45" in err and "held open by pid 4242 (qemu-kvm)" in err
    assert tree.driver_of(GPU) == "vfio-pci"
    assert _spec(dirs, "uid-gpu") is None  # files go at once
    rec = preparer.checkpoint.get("uid-gpu")
    assert rec is not None and rec.state == RELEASING
    report = run(preparer.reconcile())
    assert len(report.kept) == 1 and "pid 4242" in report.kept[0]
    assert tree.driver_of(GPU) == "vfio-pci"
    import shutil

    shutil.rmtree(tree.root / "proc/4242")  # QEMU exited
    report = run(preparer.reconcile())
    assert report.kept == [] and tree.driver_of(GPU) == "nvidia"
    assert preparer.checkpoint.get("uid-gpu") is None


# -- reconcile -----------------------------------------------------------------------------
@pytest.mark.parametrize("change", ["deleted", "recreated", "deallocated", "moved"])
def test_reconcile_unprepares_stale_claims(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str], change: str
) -> None:
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    keep = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    run(preparer.prepare([ref, keep]))
    obj = claims.objects[("default", "vm-nic")]
    if change == "deleted":
        del claims.objects[("default", "vm-nic")]
    elif change == "recreated":
        obj["metadata"]["uid"] = "uid-new"
    elif change == "deallocated":
        del obj["status"]["allocation"]
    else:
        obj["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    report = run(preparer.reconcile())
    assert [u.split(":")[0] for u in report.unprepared] == ["default/vm-nic (uid uid-nic)"]
    assert tree.driver_of(E1000_A) == "e1000" and tree.driver_of(E1000_B) == "e1000"
    assert _spec(dirs, "uid-nic") is None
    assert tree.driver_of(GPU) == "vfio-pci" and _spec(dirs, "uid-gpu") is not None


def test_reconcile_never_acts_on_a_claim_it_cannot_read(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims
) -> None:
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    run(preparer.prepare([ref]))
    claims.fail = TimeoutError("API server timed out")
    report = run(preparer.reconcile())
    assert report.unprepared == [] and "cannot read it, kept" in report.errors[0]
    assert tree.driver_of(E1000_A) == "vfio-pci"


def _three_claims(claims: Claims) -> list[ClaimRef]:
    """Claims of the e1000 pair, the GPU and the lone NIC."""
    return [
        claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")]),
        claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")]),
        claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")]),
    ]


def test_a_resync_reconcile_reads_a_share_of_the_claims_the_least_recently_read_first(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims
) -> None:
    """1,000 prepared claims read from the API server at every resync were 1,000 GETs each
    5 s (5.6 % of a core idle, 43 requests a second): a resync now reads ``budget`` of them,
    those read longest ago first, so a stale claim is still released within a cycle."""
    read: list[str] = []
    plain = claims.read

    async def counted(namespace: str, name: str) -> dict[str, Any] | None:
        read.append(name)
        return await plain(namespace, name)

    preparer.reconciler.read_claim = counted
    refs = _three_claims(claims)
    assert all(r.error == "" for r in run(preparer.prepare(refs)).values())
    run(preparer.reconcile())  # at start: every claim
    assert sorted(read) == ["vm-gpu", "vm-lone", "vm-nic"]
    read.clear()
    for _ in range(3):
        run(preparer.reconcile(budget=1))
    assert sorted(read) == ["vm-gpu", "vm-lone", "vm-nic"]  # one each, none twice
    del claims.objects[("default", "vm-lone")]
    released: list[str] = []
    for _ in range(3):
        read.clear()
        report = run(preparer.reconcile(budget=1))
        assert len(read) == 1
        released += [u.split(" ")[0] for u in report.unprepared]
    assert released == ["default/vm-lone"]  # within one cycle of the reads
    read.clear()
    run(preparer.reconcile(budget=0))  # a resync too soon for any read
    assert read == []


def test_the_start_reconcile_reads_the_claims_a_few_at_a_time(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims
) -> None:
    """At start every claim is read before kubelet can call: one by one, 1,000 claims kept
    a restarted plugin from registering for ~50 s here; now READS_AT_ONCE are under way."""
    from vfio_dp.dra.claimpath.reconcile import READS_AT_ONCE

    state = {"now": 0, "most": 0}
    plain = claims.read

    async def slow(namespace: str, name: str) -> dict[str, Any] | None:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.05)  # an API round trip
        state["now"] -= 1
        return await plain(namespace, name)

    preparer.reconciler.read_claim = slow
    refs = _three_claims(claims)
    run(preparer.prepare(refs))
    report = run(preparer.reconcile())
    assert report.unprepared == [] and report.errors == []
    assert 2 <= state["most"] <= READS_AT_ONCE, state


def test_reconcile_keeps_held_group_of_a_deleted_claim(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
) -> None:
    """Force-deleted pod: the ResourceClaim is gone but its QEMU still holds the group (kept,
    retried, logged and counted)."""
    from vfio_dp.core.metrics import Metrics

    metrics = Metrics()
    preparer = _preparer(tree, kernel, config, claims, dirs, metrics=metrics)
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    run(preparer.prepare([ref]))
    del claims.objects[("default", "vm-nic")]
    _hold(tree, 777, "/dev/vfio/7")
    report = run(preparer.reconcile())
    assert report.unprepared == [] and "held open by pid 777" in report.kept[0]
    assert tree.driver_of(E1000_A) == "vfio-pci"
    assert metrics.get("vfio_dp_dra_held_groups") == 1
    assert "vfio_dp_dra_prepared_total 1" in metrics.render()
    import shutil

    shutil.rmtree(tree.root / "proc/777")
    report = run(preparer.reconcile())
    assert tree.driver_of(E1000_A) == "e1000" and len(report.unprepared) == 1
    assert metrics.get("vfio_dp_dra_held_groups") == 0


def test_reconcile_restores_a_claim_binding_no_checkpoint_knows(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer
) -> None:
    """Killed after the bind, before the checkpoint said so (or a corrupt checkpoint)."""
    Host(tree.root, kernel=kernel).bind(
        [PciAddress.parse(E1000_A)], group=True, probe=False, bound_by=bound_by_claim("uid-lost")
    )
    report = run(preparer.reconcile())
    assert tree.driver_of(E1000_A) == "e1000" and tree.driver_of(E1000_B) == "e1000"
    assert "uid-lost" in report.unprepared[0]


def test_restart_reads_the_checkpoint(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
    preparer: ClaimPreparer,
) -> None:
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    run(preparer.prepare([ref]))
    del claims.objects[("default", "vm-nic")]
    restarted = _preparer(tree, kernel, config, claims, dirs)  # a new process (SIGKILL before)
    report = run(restarted.reconcile())
    assert len(report.unprepared) == 1 and tree.driver_of(E1000_A) == "e1000"


def test_boot_id_change_reverifies_against_the_hardware(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
    preparer: ClaimPreparer,
) -> None:
    a = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    b = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
    run(preparer.prepare([a, b]))
    # "reboot": new boot ID; group 50 renumbered to 51
    _boot(tree, "boot-2")
    for name in ("iommu_group",):
        link = tree.dev_dir(LONE) / name
        link.unlink()
        g = tree.sys("kernel/iommu_groups/51/devices")
        g.mkdir(parents=True)
        (g / LONE).symlink_to(os.path.relpath(tree.dev_dir(LONE), g))
        link.symlink_to(os.path.relpath(tree.sys("kernel/iommu_groups/51"), link.parent))
    (tree.sys("kernel/iommu_groups/50/devices") / LONE).unlink()
    restarted = _preparer(tree, kernel, config, claims, dirs)
    report = run(restarted.reconcile())
    assert report.reverified == ["default/vm-nic (uid uid-nic)"]
    assert len(report.invalidated) == 1
    assert "0000:65:00.0 is in IOMMU group 51, was 50" in report.invalidated[0]
    assert _spec(dirs, "uid-lone") is None and _spec(dirs, "uid-nic") is not None
    assert Checkpoint(restarted.host.fs, DRIVER).load()["uid-nic"].boot_id == "boot-2"
    # kubelet re-prepares after the reboot: answered from the hardware as it is now
    out = run(restarted.prepare([b]))["uid-lone"]
    assert out.error == "" and _spec(dirs, "uid-lone") is not None
    spec = _spec(dirs, "uid-lone")
    assert (
        spec is not None
        and {"path": "/dev/vfio/51"} in spec["devices"][0]["containerEdits"]["deviceNodes"]
    )


def test_after_a_reboot_every_claim_is_reverified_against_one_scan(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
    preparer: ClaimPreparer,
) -> None:
    """A node rebooted with many prepared claims: the reconcile reads the host once, not
    once per claim (1,000 claims on a host of 4,096 devices were 1,000 full scans)."""
    a = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    b = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
    run(preparer.prepare([a, b]))
    _boot(tree, "boot-2")
    restarted = ClaimPreparer(
        host=CountingHost(tree.root, kernel=kernel), driver=DRIVER, node=NODE,
        cdi_dir=dirs[0], plugins_dir=dirs[1], read_claim=claims.read, config=lambda: config,
    )  # fmt: skip
    report = run(restarted.reconcile())
    assert sorted(report.reverified) == [
        "default/vm-lone (uid uid-lone)",
        "default/vm-nic (uid uid-nic)",
    ]
    assert isinstance(restarted.host, CountingHost) and restarted.host.scans == 1


# -- through the API-server stand-in with the real kubernetes client -------------------------
@pytest.fixture
def real_reader(apiserver: Any) -> Iterator[Any]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api_client = apiserver.client()
    v1 = client.ResourceV1Api(api_client)

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        def get() -> dict[str, Any] | None:
            try:
                resp = v1.read_namespaced_resource_claim(name, namespace, _preload_content=False)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
            data: dict[str, Any] = json.loads(resp.data)
            return data

        return await asyncio.to_thread(get)

    yield read
    api_client.close()


def test_prepare_reads_claims_from_the_api_server_standin(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    apiserver: Any,
    real_reader: Any,
    dirs: tuple[str, str],
) -> None:
    from tests.dra.apiserver_standin import CLAIMS

    stored = apiserver.seed(
        CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "vm-nic", "namespace": "default"},
            "spec": {
                "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}
            },
            "status": {
                "allocation": {"devices": {"results": [result("pci-0000-03-01-0")]}},
                "reservedFor": [{"resource": "pods", "name": "virt-launcher-x", "uid": "pod-1"}],
            },
        },
    )
    uid = stored["metadata"]["uid"]
    _boot(tree, "boot-1")
    p = ClaimPreparer(
        host=Host(tree.root, kernel=kernel),
        driver=DRIVER,
        node=NODE,
        cdi_dir=dirs[0],
        plugins_dir=dirs[1],
        read_claim=real_reader,
        config=lambda: config,
    )
    ok = ClaimRef("default", uid, "vm-nic")
    out = run(p.prepare([ok, ClaimRef("default", "uid-nope", "nope")]))
    assert out[uid].error == "" and tree.driver_of(E1000_A) == "vfio-pci"
    assert "does not exist" in out["uid-nope"].error
    assert run(p.unprepare([ok])) == {uid: ""}
    assert tree.driver_of(E1000_A) == "e1000"


def test_a_group_a_stale_claim_bound_is_taken_over(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims
) -> None:
    """The group was bound by claim A (gone, not reconciled yet) and is now allocated to claim
    B: B owns the binding, so A's release never pulls the group from under B's pod."""
    Host(tree.root, kernel=kernel).bind(
        [PciAddress.parse(E1000_A)], group=True, probe=False, bound_by=bound_by_claim("uid-old")
    )
    ref = claims.add("vm-new", "uid-new", [result("pci-0000-03-01-0")])
    assert run(preparer.prepare([ref]))["uid-new"].error == ""
    assert _record(tree, E1000_A)["bound_by"] == "claim:uid-new"  # type: ignore[index]
    assert _record(tree, E1000_B)["bound_by"] == "claim:uid-new"  # type: ignore[index]
    report = run(preparer.reconcile())  # nothing of uid-old is left to release
    assert report.unprepared == [] and tree.driver_of(E1000_A) == "vfio-pci"
    assert run(preparer.unprepare([ref])) == {"uid-new": ""}
    assert tree.driver_of(E1000_A) == "e1000" and tree.driver_of(E1000_B) == "e1000"


def test_on_prepare_never_binds_a_parent_the_configs_mdev_entries_want(
    tree: SysfsTree, kernel: SimulatedKernel, claims: Claims, dirs: tuple[str, str]
) -> None:
    """Issue 35 item 1: a ``bind: onPrepare`` selector takes the GPU, but an ``mdev:`` entry
    wants instances of it: the claim's error names the entry and the fix, nothing is bound."""
    _boot(tree, "boot-1")
    config = load_config_text(
        CONFIG + "mdev:\n- {parent: {vendor: '10de', device: '1eb8'}, type: nvidia-222, "
        "path: dra, create: onPrepare}\n",
        "test",
    )
    preparer = _preparer(tree, kernel, config, claims, dirs)
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    err = run(preparer.prepare([ref]))["uid-gpu"].error
    assert "binding the IOMMU group to its VFIO driver failed" in err
    assert (
        "is the parent of the config's mdev entry {parent: a PCI selector, type: nvidia-222" in err
    )
    assert tree.driver_of(GPU) == "nvidia" and tree.driver_of(AUDIO) == "snd_hda_intel"
    assert kernel.writes == [] and _record(tree, GPU) is None
