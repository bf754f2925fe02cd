"""The DRA plugin's checkpoint: which claims it prepared, with what, in which boot.

``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json``, rewritten whole and atomically
(:func:`vfio_dp.host.atomic.write_atomic`) on every change::

    {"version": 1, "driver": "vfio.example.com", "claims": {
      "<uid>": {"namespace": "default", "name": "vm-nic", "uid": "<uid>", "state": "prepared",
                "bootID": "0f4c...", "podClaimName": null,
                "devices": [{"requests": ["nic"], "pool": "node-1", "device": "pci-0000-3b-00-0",
                             "iommuGroup": 45, "addresses": ["0000:3b:00.0"], "ids": ["8086:10d3"],
                             "adminAccess": false, "cdiDeviceIds": ["vfio.example.com/vfio=..."]}]}}}

``state`` is ``preparing`` from before the first bind until the CDI spec and metadata are
written, then ``prepared``; a crash in between leaves ``preparing`` for reconcile to finish or
undo. ``releasing``: kubelet unprepared the claim but a group it bound was still held open;
reconcile gives it back once nobody holds it. Each claim carries the boot ID (``<root>/proc/sys/kernel/random/boot_id``) it was
prepared or last verified in: after a reboot the IOMMU group numbers and drivers may have
changed, so a claim from another boot is *untrusted* until it has been re-verified against
the hardware (:meth:`Checkpoint.untrusted`, :meth:`Checkpoint.mark_verified`).

Who bound a device is NOT here: it is in the bind record (``bound_by``), the one source of
truth the restore follows; the checkpoint only says what each claim was answered.
A checkpoint that cannot be parsed is moved aside (``.corrupt-<time>``), reported, and the
plugin starts empty: the bind records and the files on disk still let reconcile undo what
claims bound.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from vfio_dp.dra import cdi
from vfio_dp.errors import DraError
from vfio_dp.host.atomic import write_atomic
from vfio_dp.host.host import read_boot_id
from vfio_dp.host.root import Root

if TYPE_CHECKING:
    from vfio_dp.host import Host

VERSION = 1
PREPARING = "preparing"
PREPARED = "prepared"
RELEASING = "releasing"  # unprepared by kubelet, devices still to give back (held open)
_MAX_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One DRA device a claim was given (a whole IOMMU group, named by its first endpoint)."""

    requests: tuple[str, ...]
    pool: str
    device: str
    iommu_group: int | None
    addresses: tuple[str, ...]  # every endpoint of the group, first = the named one
    ids: tuple[str, ...]  # vendor:device of each address, to notice changed hardware
    admin_access: bool = False
    cdi_device_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    namespace: str
    name: str
    uid: str
    state: str = PREPARING
    boot_id: str = ""
    pod_claim_name: str | None = None
    devices: tuple[DeviceRecord, ...] = field(default_factory=tuple)

    @property
    def ref(self) -> str:
        """``default/vm-nic (uid 6f1c...)``: how messages name the claim."""
        return f"{self.namespace}/{self.name} (uid {self.uid})"


def _device_to_json(d: DeviceRecord) -> dict[str, object]:
    return {
        "requests": list(d.requests),
        "pool": d.pool,
        "device": d.device,
        "iommuGroup": d.iommu_group,
        "addresses": list(d.addresses),
        "ids": list(d.ids),
        "adminAccess": d.admin_access,
        "cdiDeviceIds": list(d.cdi_device_ids),
    }


def _claim_to_json(c: ClaimRecord) -> dict[str, object]:
    return {
        "namespace": c.namespace,
        "name": c.name,
        "uid": c.uid,
        "state": c.state,
        "bootID": c.boot_id,
        "podClaimName": c.pod_claim_name,
        "devices": [_device_to_json(d) for d in c.devices],
    }


def _strs(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what} must be a list of strings")
    return tuple(value)


def _device_from_json(d: object) -> DeviceRecord:
    if not isinstance(d, dict):
        raise TypeError("device must be an object")
    group = d.get("iommuGroup")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
        raise TypeError("iommuGroup must be an integer or null")
    return DeviceRecord(
        requests=_strs(d["requests"], "requests"),
        pool=str(d["pool"]),
        device=str(d["device"]),
        iommu_group=group,
        addresses=_strs(d["addresses"], "addresses"),
        ids=_strs(d.get("ids", []), "ids"),
        admin_access=bool(d.get("adminAccess", False)),
        cdi_device_ids=_strs(d.get("cdiDeviceIds", []), "cdiDeviceIds"),
    )


def _claim_from_json(c: object) -> ClaimRecord:
    if not isinstance(c, dict):
        raise TypeError("claim must be an object")
    state = str(c.get("state", PREPARING))
    if state not in (PREPARING, PREPARED, RELEASING):
        raise ValueError(f"unknown claim state {state!r}")
    pcn = c.get("podClaimName")
    devices = c.get("devices", [])
    if not isinstance(devices, list):
        raise TypeError("devices must be a list")
    return ClaimRecord(
        namespace=str(c["namespace"]),
        name=str(c["name"]),
        uid=cdi.check_uid(str(c["uid"])),
        state=state,
        boot_id=str(c.get("bootID", "")),
        pod_claim_name=None if pcn is None else str(pcn),
        devices=tuple(_device_from_json(d) for d in devices),
    )


STATE_DIR = ("var", "lib", "vfio_dp")


def file_name(driver: str) -> str:
    """``dra-<driver>.checkpoint.json``."""
    return f"dra-{cdi.check_driver(driver)}.checkpoint.json"


class Checkpoint:
    """The claims this plugin prepared, kept in memory and on disk; thread-safe."""

    def __init__(self, root: Root, driver: str) -> None:
        self._setup(root.path(*STATE_DIR, file_name(driver)), read_boot_id(root), driver)

    @classmethod
    def for_host(cls, host: Host, driver: str) -> Checkpoint:
        """The checkpoint of ``driver`` under ``host``'s root, stamped with its boot ID."""
        self = cls.__new__(cls)
        self._setup(host.state_file(file_name(driver)), host.boot_id(), driver)
        return self

    def _setup(self, path: str, boot_id: str, driver: str) -> None:
        self.path = path
        self.driver = cdi.check_driver(driver)
        self.boot_id = boot_id
        self._lock = threading.Lock()
        self._claims: dict[str, ClaimRecord] = {}
        self.problems: list[str] = []  # what load() had to set aside, for the log

    def load(self) -> dict[str, ClaimRecord]:
        """Read the file (absent: empty). An unreadable one is moved aside and reported in
        :attr:`problems`; the plugin starts empty rather than refusing to start."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(_MAX_BYTES + 1)
        except FileNotFoundError:
            raw = None
        except OSError as e:
            raise DraError(f"cannot read the DRA checkpoint {self.path}: {e.strerror or e}") from e
        claims: dict[str, ClaimRecord] = {}
        if raw is not None:
            try:
                if len(raw) > _MAX_BYTES:
                    raise ValueError(f"larger than {_MAX_BYTES} bytes")
                data = json.loads(raw)
                if not isinstance(data, dict) or data.get("version") != VERSION:
                    raise ValueError(f"not a version-{VERSION} checkpoint")
                body = data.get("claims")
                if not isinstance(body, dict):
                    raise TypeError("claims must be an object")
                for uid, c in body.items():
                    rec = _claim_from_json(c)
                    if rec.uid != uid:
                        raise ValueError(f"claim keyed {uid!r} says uid {rec.uid!r}")
                    claims[uid] = rec
            except (ValueError, TypeError, KeyError, DraError) as e:
                aside = f"{self.path}.corrupt-{int(time.time())}"
                os.replace(self.path, aside)
                self.problems.append(
                    f"unreadable DRA checkpoint moved to {aside} ({e}); starting empty -- "
                    "reconcile still restores devices claims bound (their bind records say so)"
                )
                claims = {}
        with self._lock:
            self._claims = claims
            return dict(claims)

    def _save(self) -> None:
        body = {
            "version": VERSION,
            "driver": self.driver,
            "claims": {u: _claim_to_json(c) for u, c in sorted(self._claims.items())},
        }
        write_atomic(self.path, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode())

    def get(self, uid: str) -> ClaimRecord | None:
        with self._lock:
            return self._claims.get(uid)

    def all(self) -> Mapping[str, ClaimRecord]:
        with self._lock:
            return dict(self._claims)

    def put(self, record: ClaimRecord) -> ClaimRecord:
        """Store (replace) ``record`` stamped with the current boot ID, durably before
        returning; returns what was stored."""
        stamped = replace(record, boot_id=self.boot_id)
        with self._lock:
            previous = self._claims.get(record.uid)
            self._claims[record.uid] = stamped
            try:
                self._save()
            except BaseException:
                if previous is None:
                    del self._claims[record.uid]
                else:
                    self._claims[record.uid] = previous
                raise
        return stamped

    def remove(self, uid: str) -> bool:
        """Forget a claim durably; False when it was not there."""
        with self._lock:
            previous = self._claims.pop(uid, None)
            if previous is None:
                return False
            try:
                self._save()
            except BaseException:
                self._claims[uid] = previous
                raise
        return True

    def trusted(self, record: ClaimRecord) -> bool:
        """Prepared or verified in this boot (and the kernel told us which boot this is)."""
        return bool(self.boot_id) and record.boot_id == self.boot_id

    def untrusted(self) -> list[ClaimRecord]:
        """Claims from another boot: re-verify each against the hardware before trusting it."""
        with self._lock:
            return [c for c in self._claims.values() if not self.trusted(c)]

    def mark_verified(self, uid: str) -> None:
        """The claim's devices were checked against this boot's hardware: trust it."""
        rec = self.get(uid)
        if rec is not None:
            self.put(rec)


def peek(host: Host, driver: str) -> tuple[list[ClaimRecord], str | None]:
    """The checkpointed claims, read-only (``vfioctl``: never moves a bad file aside, never
    writes): (records, None), or ([], why) when the file cannot be read or parsed."""
    path = host.state_file(file_name(driver))
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return [], None
    except OSError as e:
        return [], f"cannot read the DRA checkpoint {path}: {e.strerror or e}"
    try:
        data = json.loads(raw)
        body = data.get("claims") if isinstance(data, dict) else None
        if not isinstance(body, dict) or len(raw) > _MAX_BYTES:
            raise ValueError("not a DRA checkpoint")
        return [_claim_from_json(c) for c in body.values()], None
    except (ValueError, TypeError, KeyError, AttributeError, DraError) as e:
        return [], f"the DRA checkpoint {path} is unreadable ({e})"
