"""Mediated devices on the DRA path (issue 35 item 4), on the kernel simulator (tests/mdev_tree.py):
the pool's mdev entries (static instances, onPrepare slots with the parent's counter), the
scheduler stand-in never giving out more than the parent holds, Prepare making the instance
with the UUID it checkpointed first, a kill between the two leaking nothing, Unprepare
removing it (refused while held open, retried), and the classes' ``kind`` guards."""

from __future__ import annotations

import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import (
    CLAIMS,
    DEVICE_CLASSES,
    SLICES,
    ApiServerStandin,
    Unschedulable,
    validate_slice,
)
from tests.dra.cel_view import cel, cel_view
from tests.dra.scheduler_standin import SchedulerStandin
from tests.dra.test_prepare import DRIVER, NODE, Claims, _boot, result, run
from tests.mdev_tree import MdevKernel, add_instance, add_parent
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath import cdi, mdev
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.dra.claimpath.checkpoint import PREPARING, Checkpoint
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.dra.deviceclasses import (
    device_classes,
    mdev_class_name,
    mdev_device_classes,
    native_device_class,
)
from vfio_dp.dra.mdev_slices import slot_name
from vfio_dp.dra.personalities import fit_api
from vfio_dp.dra.slices import NodeRef, build_slices
from vfio_dp.host import Host
from vfio_dp.host.mdev_ops import Mdevs
from vfio_dp.model.config import load_config_text
from vm_translate.allocation import MdevSource, assign
from vm_translate.dra import address_from
from vm_translate.entries import ClaimEntry
from vm_translate.hostdev import render

GPU = "0000:3b:00.0"
STATIC_UUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"
CONFIG = f"""
mdev:
  - parent: mtty
    type: mtty-2
    count: all
    create: onPrepare
    path: dra
  - parent: "{GPU}"
    type: nvidia-222
    count: 1
    path: dra
"""
SLOT0 = slot_name("mtty", "mtty-2", 0)


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path / "root")
    t.add(Dev(GPU, "10de", "1eb8", "030200", driver="nvidia", group=45, numa=1))
    add_parent(
        t,
        "mtty",
        {"mtty-1": ("Single port serial", 24, "vfio-pci"), "mtty-2": ("Dual port serial", 12, "vfio-pci")},
        driver="mtty",
    )  # fmt: skip
    add_parent(t, GPU, {"nvidia-222": ("GRID T4-1Q", 15, "vfio-pci")})
    add_instance(t, GPU, "nvidia-222", STATIC_UUID, group=100)
    _boot(t, "boot-1")
    return t


CLAIMS_API = Claims()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CLAIMS_API.objects.clear()
    CLAIMS_API.fail = None


def _preparer(tree: SysfsTree, kernel: MdevKernel, tmp_path: Path) -> ClaimPreparer:
    config = load_config_text(CONFIG, "test")
    return ClaimPreparer(
        host=Host(tree.root, kernel=kernel, runner="dra-plugin"),
        driver=DRIVER,
        node=NODE,
        cdi_dir=str(tmp_path / "cdi"),
        plugins_dir=str(tmp_path / "plugins"),
        read_claim=CLAIMS_API.read,
        config=lambda: config,
    )


def _pool(tree: SysfsTree) -> list[Any]:
    config = load_config_text(CONFIG, "test")
    return mdev.pool(Host(tree.root), config, {}, {})


def _instances(tree: SysfsTree) -> set[str]:
    d = tree.root / "sys/bus/mdev/devices"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def _meta_attrs(tmp_path: Path, uid: str, request: str) -> dict[str, Any]:
    base = Path(mdfile.claims_dir(str(tmp_path / "plugins"), DRIVER)) / uid / request
    (path,) = base.glob("*-metadata.json")
    first, _ = json.JSONDecoder().raw_decode(path.read_text())
    return first["requests"][0]["devices"][0]["attributes"]  # type: ignore[no-any-return]


def _nodes(tmp_path: Path, uid: str) -> list[str]:
    spec = cdi.read_spec(str(tmp_path / "cdi"), DRIVER, uid)
    assert spec is not None
    devices: list[dict[str, Any]] = spec["devices"]  # type: ignore[assignment]
    return [n["path"] for d in devices for n in d["containerEdits"].get("deviceNodes", [])]


# -- publication -------------------------------------------------------------------------
def test_the_pool_has_static_instances_and_counted_slots(tree: SysfsTree) -> None:
    entries = _pool(tree)
    by_name = {m.device.name: m.device for m in entries}
    slots = [n for n in by_name if n.startswith("mdev-mtty-")]
    assert sorted(slots) == sorted(slot_name("mtty", "mtty-2", k) for k in range(12))
    static = by_name[f"mdev-{STATIC_UUID}"]
    attrs = {k: a.value for k, a in static.attributes.items()}
    assert attrs == {
        "kind": "mdev",
        "mdevType": "nvidia-222",
        "mdevTypeName": "GRID T4-1Q",
        "mdevParent": GPU,
        "mdevUUID": STATIC_UUID,
        "resource.kubernetes.io/pciBusID": GPU,
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "numaNode": 1,
        "resource.kubernetes.io/numaNode": 1,
    }
    assert static.consumes == ()
    slot = by_name[SLOT0]
    assert {k: a.value for k, a in slot.attributes.items()} == {
        "kind": "mdev",
        "mdevType": "mtty-2",
        "mdevTypeName": "Dual port serial",
        "mdevParent": "mtty",
    }
    (use,) = slot.consumes  # mtty-2 costs 2 of mtty's 24 ports
    assert (use.counter_set, use.counter, use.value, use.total) == ("mdev-mtty", "units", 2, 24)
    slices = build_slices(
        [m.device for m in entries], driver=DRIVER, node=NodeRef(NODE), generation=1
    )
    for s in slices:
        assert validate_slice(s, None) == [], s["metadata"]["name"]
    counters = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
    assert counters == [{"name": "mdev-mtty", "counters": {"units": {"value": "24"}}}]
    # a cluster that drops counters: the static instance only, never an uncounted slot
    assert [d.name for d in fit_api([m.device for m in entries], counters=False, binding=True)] == [
        f"mdev-{STATIC_UUID}"
    ]


def test_device_names_are_dns_labels_and_stable() -> None:
    assert slot_name("0000:3b:00.0", "nvidia-222", 3) == "mdev-0000-3b-00-0-nvidia-222-3"
    odd = slot_name("0000:00:02.0", "i915-GVTg_V5_4", 0)
    assert (
        odd
        == slot_name("0000:00:02.0", "i915-GVTg_V5_4", 0)
        != slot_name("0000:00:02.0", "i915-gvtg-v5-4", 0)
    )
    assert len(odd) <= 63 and odd.replace("-", "").isalnum() and odd.islower()


def test_the_scheduler_never_gives_out_more_than_the_parent_holds(
    tree: SysfsTree, apiserver: ApiServerStandin
) -> None:
    entries = _pool(tree)
    for s in build_slices(
        [m.device for m in entries], driver=DRIVER, node=NodeRef(NODE), generation=1
    ):
        apiserver.seed(SLICES, s)
    config = load_config_text(CONFIG, "test")
    for c in mdev_device_classes(config, DRIVER):
        apiserver.seed(DEVICE_CLASSES, c)
    sched = SchedulerStandin(apiserver)
    cls = mdev_class_name(DRIVER, "mtty-2")
    for i in range(13):
        apiserver.seed(CLAIMS, _claim(f"c{i}", cls))
    got = []
    for i in range(12):
        got.append(
            sched.allocate("default", f"c{i}", NODE)["status"]["allocation"]["devices"]["results"][
                0
            ]["device"]
        )
    assert len(set(got)) == 12
    with pytest.raises(Unschedulable):
        sched.allocate("default", "c12", NODE)


def _claim(name: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}}]}},
    }  # fmt: skip


def test_pci_classes_never_select_mdev_entries_and_the_mdev_class_does(tree: SysfsTree) -> None:
    devices = cel_view([m.device.to_json() for m in _pool(tree)], DRIVER)
    pci_config = load_config_text('selectors:\n  - vendor: "10de"\n    path: dra\n', "t")
    pci = [*device_classes(pci_config, DRIVER, [("10de", "1eb8")]), native_device_class(DRIVER)]
    for c in pci:
        check = cel(c["spec"]["selectors"][0]["cel"]["expression"])
        assert not any(check(d) for d in devices), c["metadata"]["name"]
    (tty, gpu) = mdev_device_classes(load_config_text(CONFIG, "t"), DRIVER)
    assert tty["metadata"]["name"] == f"mtty-2.mdev.{DRIVER}"
    pick = cel(tty["spec"]["selectors"][0]["cel"]["expression"])
    assert {d["name"] for d in devices if pick(d)} == {
        slot_name("mtty", "mtty-2", k) for k in range(12)
    }
    pick = cel(gpu["spec"]["selectors"][0]["cel"]["expression"])
    assert {d["name"] for d in devices if pick(d)} == {f"mdev-{STATIC_UUID}"}


# -- Prepare / Unprepare -----------------------------------------------------------------
def test_prepare_makes_the_instance_with_its_checkpointed_uuid_and_unprepare_removes_it(
    tree: SysfsTree, tmp_path: Path
) -> None:
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    ref = CLAIMS_API.add("tty", "uid-1", [result(SLOT0, request="serial")])
    out = run(p.prepare([ref]))["uid-1"]
    assert out.error == ""
    (rec,) = p.checkpoint.get("uid-1").devices  # type: ignore[union-attr]
    u = rec.mdev_uuid
    assert u is not None and u in _instances(tree)
    made = Mdevs(Host(tree.root)).store.get(u)
    assert made is not None and made.by == "claim:uid-1"
    group = (tree.root / "sys/bus/mdev/devices" / u / "iommu_group").resolve().name
    assert _nodes(tmp_path, "uid-1") == ["/dev/vfio/vfio", f"/dev/vfio/{group}"]
    attrs = _meta_attrs(tmp_path, "uid-1", "serial")
    assert attrs["mdevUUID"] == {"string": u} and attrs["kind"] == {"string": "mdev"}
    # what vfioctl hostdev (as KubeVirt's launcher) takes from that file: the mdev by UUID
    base = Path(mdfile.claims_dir(str(tmp_path / "plugins"), DRIVER)) / "uid-1" / "serial"
    files = [(str(f), f.read_text()) for f in base.glob("*-metadata.json")]
    entry = ClaimEntry("tty1", "tty", "serial", "gpu")
    assert address_from(entry, files, str(base)) == MdevSource(u)
    (hostdev,) = assign([entry], {}, {("tty", "serial"): MdevSource(u)})
    assert f'<address uuid="{u}"/>' in render([hostdev]) and 'type="mdev"' in render([hostdev])
    # the slots stay 12 with the same names (11 available + the one the claim made)
    assert len([m for m in _pool(tree) if m.slot]) == 12
    assert run(p.prepare([ref]))["uid-1"].error == ""  # kubelet's retry: the same instance
    assert _instances(tree) == {STATIC_UUID, u}
    assert run(p.unprepare([ref])) == {"uid-1": ""}
    assert _instances(tree) == {STATIC_UUID}
    assert Mdevs(Host(tree.root)).store.get(u) is None and p.checkpoint.get("uid-1") is None


def test_a_static_instance_is_handed_over_and_left_at_unprepare(
    tree: SysfsTree, tmp_path: Path
) -> None:
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    ref = CLAIMS_API.add("gpu", "uid-g", [result(f"mdev-{STATIC_UUID}", request="gpu")])
    assert run(p.prepare([ref]))["uid-g"].error == ""
    assert _nodes(tmp_path, "uid-g") == ["/dev/vfio/vfio", "/dev/vfio/100"]
    attrs = _meta_attrs(tmp_path, "uid-g", "gpu")
    assert attrs["mdevUUID"] == {"string": STATIC_UUID}
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": GPU}  # mdevUUID wins in KubeVirt
    other = CLAIMS_API.add("gpu2", "uid-h", [result(f"mdev-{STATIC_UUID}", request="gpu")])
    assert "prepared for claim default/gpu" in run(p.prepare([other]))["uid-h"].error
    assert run(p.unprepare([ref])) == {"uid-g": ""}
    assert STATIC_UUID in _instances(tree)


class Killed(BaseException):
    """A kill (SIGKILL) at the instance's sysfs create."""


def test_killed_between_the_checkpoint_and_the_create_leaks_nothing(
    tree: SysfsTree, tmp_path: Path
) -> None:
    kernel = MdevKernel(tree)

    def killed(path: str, data: str) -> None:
        if path.endswith("/create"):
            raise Killed(path)

    kernel.fail = killed
    ref = CLAIMS_API.add("tty", "uid-k", [result(SLOT0, request="serial")])
    with pytest.raises(Killed):
        run(_preparer(tree, kernel, tmp_path).prepare([ref]))
    # on disk: the claim is preparing with its UUID, and no instance was made
    (rec,) = Checkpoint(Host(tree.root).fs, DRIVER).load()["uid-k"].devices
    assert Checkpoint(Host(tree.root).fs, DRIVER).load()["uid-k"].state == PREPARING
    assert rec.mdev_uuid is not None and _instances(tree) == {STATIC_UUID}
    # a restart (the mdev pass finishes or undoes the journal), then kubelet's retry
    Mdevs(Host(tree.root, kernel=MdevKernel(tree), runner="dra-plugin"), by="dra-plugin").recover()
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    assert run(p.prepare([ref]))["uid-k"].error == ""
    assert _instances(tree) == {STATIC_UUID, rec.mdev_uuid}  # the UUID it recorded
    # the claim deleted instead: reconcile releases it and nothing is left
    CLAIMS_API.objects.clear()
    report = run(p.reconcile())
    assert not report.errors
    assert _instances(tree) == {STATIC_UUID} and p.checkpoint.all() == {}


def test_a_claim_gone_after_the_kill_is_released_with_nothing_to_remove(
    tree: SysfsTree, tmp_path: Path
) -> None:
    kernel = MdevKernel(tree)
    kernel.fail = lambda path, data: (_ for _ in ()).throw(Killed(path))
    ref = CLAIMS_API.add("tty", "uid-z", [result(SLOT0, request="serial")])
    with pytest.raises(Killed):
        run(_preparer(tree, kernel, tmp_path).prepare([ref]))
    CLAIMS_API.objects.clear()
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    assert not run(p.reconcile()).errors
    assert p.checkpoint.all() == {} and _instances(tree) == {STATIC_UUID}
    assert not list((tree.root / "var/lib/vfio_dp/mdev").glob("*.json"))


def test_a_held_instance_is_kept_at_unprepare_and_removed_once_free(
    tree: SysfsTree, tmp_path: Path
) -> None:
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    ref = CLAIMS_API.add("tty", "uid-h", [result(SLOT0, request="serial")])
    assert run(p.prepare([ref]))["uid-h"].error == ""
    (rec,) = p.checkpoint.get("uid-h").devices  # type: ignore[union-attr]
    u = rec.mdev_uuid
    assert u is not None
    group = (tree.root / "sys/bus/mdev/devices" / u / "iommu_group").resolve().name
    fd = tree.root / "proc/812/fd"
    fd.mkdir(parents=True)
    (tree.root / "proc/812/comm").write_text("qemu-kvm\n")
    (fd / "31").symlink_to(f"/dev/vfio/{group}")
    err = run(p.unprepare([ref]))["uid-h"]
    assert f"mdev {u} is held" in err and "pid 812" in err and "stop its user first" in err
    assert u in _instances(tree) and p.checkpoint.get("uid-h").state == "releasing"  # type: ignore[union-attr]
    (fd / "31").unlink()
    CLAIMS_API.objects.clear()
    assert not run(p.reconcile()).errors  # the retry
    assert u not in _instances(tree) and p.checkpoint.get("uid-h") is None


def test_checkpoint_files_with_and_without_mdev_entries_load(tree: SysfsTree) -> None:
    host = Host(tree.root)
    path = tree.root / "var/lib/vfio_dp" / f"dra-{DRIVER}.checkpoint.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    u = str(uuidlib.uuid4())
    old = {
        "requests": ["r"],
        "pool": NODE,
        "device": "pci-0000-3b-00-0",
        "iommuGroup": 45,
        "addresses": [GPU],
        "ids": ["10de:1eb8"],
        "adminAccess": False,
        "cdiDeviceIds": [],
    }
    new = {**old, "device": SLOT0, "iommuGroup": None, "addresses": [], "ids": [], "mdevUUID": u}
    claims = {
        uid: {"namespace": "default", "name": uid, "uid": uid, "state": "prepared",
              "bootID": "boot-1", "podClaimName": None, "devices": [dev]}
        for uid, dev in (("uid-old", old), ("uid-new", new))
    }  # fmt: skip
    path.write_text(json.dumps({"version": 1, "driver": DRIVER, "claims": claims}))
    loaded = Checkpoint(host.fs, DRIVER).load()
    assert loaded["uid-old"].devices[0].mdev_uuid is None
    assert loaded["uid-new"].devices[0].mdev_uuid == u
    from vfio_dp.dra.claimpath.holds import checkpoint_holds

    assert set(checkpoint_holds(host.fs, DRIVER)) == {
        host_addr(GPU)
    }  # an mdev holds no PCI address


def host_addr(text: str) -> Any:
    from vfio_dp.model.address import PciAddress

    return PciAddress.parse(text)


def test_an_instance_of_a_claim_the_checkpoint_lost_is_removed_by_reconcile(
    tree: SysfsTree, tmp_path: Path
) -> None:
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    ref = CLAIMS_API.add("tty", "uid-o", [result(SLOT0, request="serial")])
    assert run(p.prepare([ref]))["uid-o"].error == ""
    (made,) = _instances(tree) - {STATIC_UUID}
    # the checkpoint set aside (corrupt), or an earlier release that dropped the claim
    (tree.root / "var/lib/vfio_dp" / f"dra-{DRIVER}.checkpoint.json").unlink()
    p = _preparer(tree, MdevKernel(tree), tmp_path)
    report = run(p.reconcile())
    assert not report.errors and made not in _instances(tree)
    assert report.unprepared == ["(uid uid-o, not checkpointed): unknown"]
    assert STATIC_UUID in _instances(tree)  # not a claim's: left
