"""The DRA checkpoint: atomic, stamped with the boot ID, untrusted after a reboot, corrupt set aside."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from vfio_dp.dra.claimpath.checkpoint import PREPARED, Checkpoint, ClaimRecord, DeviceRecord
from vfio_dp.errors import DraError
from vfio_dp.host import records as records_mod  # the checkpoint's one writer
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

    monkeypatch.setattr("vfio_dp.host.records.replace_at", enospc)  # its one writer
    with pytest.raises(DraError, match="No space left on device; free space"):
        cp.put(_claim("u-2"))
    with pytest.raises(DraError, match="No space left on device"):
        cp.remove("u-1")
    assert sorted(cp.all()) == ["u-1"]


def _put_all_at_once(cp: Checkpoint, uids: list[str]) -> dict[str, BaseException | None]:
    """``put`` from one thread per claim, released together (a kubelet batch: the handler
    runs its claims' checkpoint writes on worker threads at the same time)."""
    start = threading.Barrier(len(uids))
    outcome: dict[str, BaseException | None] = {}

    def one(uid: str) -> None:
        start.wait()
        try:
            cp.put(_claim(uid))
            outcome[uid] = None
        except BaseException as e:
            outcome[uid] = e

    threads = [threading.Thread(target=one, args=(u,)) for u in uids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


def test_changes_made_together_are_written_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: 64 claims put at once are all on disk when each put returns, in far
    fewer than 64 whole-file writes (the old code wrote the file once per claim, which made
    a batch of 1,000 claims quadratic)."""
    cp = Checkpoint(Root(tmp_path), DRIVER)
    cp.load()
    writes: list[int] = []
    real = records_mod.replace_at

    def slow_disk(dfd: int, name: str, data: bytes) -> None:
        time.sleep(0.01)  # the scenario: each fsynced write takes a while, as on a real disk
        real(dfd, name, data)
        writes.append(len(json.loads(data)["claims"]))

    monkeypatch.setattr(records_mod, "replace_at", slow_disk)
    uids = [f"u-{i}" for i in range(64)]
    outcome = _put_all_at_once(cp, uids)
    assert outcome == dict.fromkeys(uids)
    assert sorted(json.loads(Path(cp.path).read_text())["claims"]) == sorted(uids)
    assert writes[-1] == 64 and len(writes) < 32, writes
    assert sorted(Checkpoint(Root(tmp_path), DRIVER).load()) == sorted(uids)


def test_a_failed_group_write_fails_every_change_it_carried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = Checkpoint(Root(tmp_path), DRIVER)
    cp.load()
    cp.put(_claim("keep"))

    def enospc(*a: object, **k: object) -> None:
        time.sleep(0.01)  # the scenario: a slow disk that then fails, so changes pile up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records_mod, "replace_at", enospc)
    uids = [f"u-{i}" for i in range(16)]
    outcome = _put_all_at_once(cp, uids)
    assert all(isinstance(e, DraError) and "No space left" in str(e) for e in outcome.values())
    assert sorted(cp.all()) == ["keep"]  # memory undone
    monkeypatch.undo()
    cp.put(_claim("next"))  # a later write carries none of the failed changes
    assert sorted(json.loads(Path(cp.path).read_text())["claims"]) == ["keep", "next"]
