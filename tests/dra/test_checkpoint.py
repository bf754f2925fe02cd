"""The DRA checkpoint: atomic, stamped with the boot ID, untrusted after a reboot, corrupt set aside."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vfio_dp.dra.checkpoint import PREPARED, Checkpoint, ClaimRecord, DeviceRecord
from vfio_dp.errors import DraError
from vfio_dp.host.root import Root

DRIVER = "vfio.example.com"


def _boot(root: Path, boot_id: str) -> None:
    p = root / "proc/sys/kernel/random"
    p.mkdir(parents=True, exist_ok=True)
    (p / "boot_id").write_text(boot_id + "\n")


def _claim(uid: str = "u-1") -> ClaimRecord:
    dev = DeviceRecord(
        requests=("nic",),
        pool="node-1",
        device="pci-0000-03-01-0",
        iommu_group=7,
        addresses=("0000:03:01.0", "0000:03:02.0"),
        ids=("8086:100e", "8086:100e"),
        cdi_device_ids=(f"{DRIVER}/vfio={uid}-pci-0000-03-01-0",),
    )
    return ClaimRecord("default", "vm-nic", uid, PREPARED, devices=(dev,))


def test_round_trip_and_file_format(tmp_path: Path) -> None:
    _boot(tmp_path, "boot-a")
    cp = Checkpoint(Root(tmp_path), DRIVER)
    assert cp.load() == {}
    stored = cp.put(_claim())
    assert stored.boot_id == "boot-a"
    assert cp.path == f"{tmp_path}/var/lib/vfio_dp/dra-{DRIVER}.checkpoint.json"
    data = json.loads(Path(cp.path).read_text())
    assert data["version"] == 1 and data["driver"] == DRIVER
    assert data["claims"]["u-1"]["devices"][0]["addresses"] == ["0000:03:01.0", "0000:03:02.0"]
    assert data["claims"]["u-1"]["bootID"] == "boot-a"
    again = Checkpoint(Root(tmp_path), DRIVER)
    assert again.load() == {"u-1": stored}
    assert again.untrusted() == []
    assert again.remove("u-1") is True and again.remove("u-1") is False
    assert Checkpoint(Root(tmp_path), DRIVER).load() == {}


def test_reboot_makes_every_claim_untrusted_until_verified(tmp_path: Path) -> None:
    _boot(tmp_path, "boot-a")
    cp = Checkpoint(Root(tmp_path), DRIVER)
    cp.load()
    cp.put(_claim("u-1"))
    cp.put(_claim("u-2"))
    _boot(tmp_path, "boot-b")
    after = Checkpoint(Root(tmp_path), DRIVER)
    after.load()
    assert sorted(c.uid for c in after.untrusted()) == ["u-1", "u-2"]
    after.mark_verified("u-1")
    assert [c.uid for c in after.untrusted()] == ["u-2"]
    assert Checkpoint(Root(tmp_path), DRIVER).load()["u-1"].boot_id == "boot-b"


def test_no_boot_id_trusts_nothing(tmp_path: Path) -> None:
    cp = Checkpoint(Root(tmp_path), DRIVER)
    cp.load()
    cp.put(_claim())
    assert [c.uid for c in cp.untrusted()] == ["u-1"]


@pytest.mark.parametrize(
    "content",
    [
        "{torn",
        '{"version": 2, "claims": {}}',
        '{"version": 1, "claims": []}',
    ],
)
def test_corrupt_checkpoint_is_set_aside_not_fatal(tmp_path: Path, content: str) -> None:
    cp = Checkpoint(Root(tmp_path), DRIVER)
    Path(cp.path).parent.mkdir(parents=True)
    Path(cp.path).write_text(content)
    assert cp.load() == {}
    assert len(cp.problems) == 1 and "moved to" in cp.problems[0]
    aside = [p for p in os.listdir(Path(cp.path).parent) if ".corrupt-" in p]
    assert len(aside) == 1 and (Path(cp.path).parent / aside[0]).read_text() == content


@pytest.mark.parametrize(
    "record",
    [
        {"namespace": "d", "name": "n", "uid": "u-2"},
        {"namespace": "d", "name": "n", "uid": "../x"},
        {"namespace": "d", "name": "n", "uid": "u-1", "state": "odd"},
        {
            "namespace": "d",
            "name": "n",
            "uid": "u-1",
            "devices": [{"requests": ["r"], "pool": "p", "device": "d", "addresses": ["zz"]}],
        },
    ],
)
def test_one_bad_record_is_skipped_reported_and_kept(tmp_path: Path, record: object) -> None:
    cp = Checkpoint(Root(tmp_path), DRIVER)
    Path(cp.path).parent.mkdir(parents=True)
    Path(cp.path).write_text(json.dumps({"version": 1, "claims": {"u-1": record}}))
    assert cp.load() == {}
    assert cp.bad.keys() == {"u-1"}
    assert len(cp.problems) == 1 and "record 'u-1' skipped" in cp.problems[0]
    cp.put(_claim("u-3"))  # another claim's write keeps the bad record as it was
    assert json.loads(Path(cp.path).read_text())["claims"]["u-1"] == record
    assert cp.remove("u-1") is False  # kubelet unprepared it: now it goes
    assert "u-1" not in json.loads(Path(cp.path).read_text())["claims"]


def test_failed_save_keeps_memory_and_disk_consistent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = Checkpoint(Root(tmp_path), DRIVER)
    cp.load()
    cp.put(_claim("u-1"))

    def enospc(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("vfio_dp.dra.checkpoint.replace_at", enospc)
    with pytest.raises(DraError, match="No space left on device; free space"):
        cp.put(_claim("u-2"))
    with pytest.raises(DraError, match="No space left on device"):
        cp.remove("u-1")
    assert sorted(cp.all()) == ["u-1"]
