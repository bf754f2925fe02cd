"""The DRA checkpoint's file format: its claim and device records, to and from JSON.

``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json`` (one claim record per line)::

    {"version": 1, "driver": "vfio.example.com", "claims": {
      "<uid>": {"namespace": "default", "name": "vm-nic", "uid": "<uid>", "state": "prepared",
                "bootID": "0f4c...", "podClaimName": null,
                "devices": [{"requests": ["nic"], "pool": "node-1", "device": "pci-0000-3b-00-0",
                             "iommuGroup": 45, "addresses": ["0000:3b:00.0"], "ids": ["8086:10d3"],
                             "adminAccess": false, "cdiDeviceIds": ["vfio.example.com/vfio=..."]}]}}}

A device that is a mediated-device instance (:mod:`vfio_dp.dra.claimpath.mdev`) has no
addresses, ``"iommuGroup": null`` and ``"mdevUUID": "<uuid>"`` (recorded before Prepare
makes it); files without the key load as before, and an earlier release reading one with it
ignores the key (a device holding no PCI function).

Pure: no file is opened here. The store that reads and writes the file, and the read-only
reader every other reader shares, are :mod:`vfio_dp.dra.claimpath.checkpoint`; this module
is the one parser they both use (:func:`parse`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vfio_dp.errors import DraError
from vfio_dp.model.address import PciAddress

VERSION = 1
PREPARING = "preparing"
PREPARED = "prepared"
RELEASING = "releasing"  # unprepared by kubelet, devices still to give back (held open)
SWITCHED = "switched"  # switched ahead for the claim (binding conditions), not yet prepared
MAX_BYTES = 64 << 20


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
    #: an mdev entry's instance (``"mdevUUID"``; no addresses, no group): recorded before
    #: Prepare makes it (:mod:`.mdev`); absent in files of older releases
    mdev_uuid: str | None = None


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
        **({"mdevUUID": d.mdev_uuid} if d.mdev_uuid else {}),
    }


def claim_to_json(c: ClaimRecord) -> dict[str, object]:
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
        addresses=tuple(str(PciAddress.parse(a)) for a in _strs(d["addresses"], "addresses")),
        ids=_strs(d.get("ids", []), "ids"),
        admin_access=bool(d.get("adminAccess", False)),
        cdi_device_ids=_strs(d.get("cdiDeviceIds", []), "cdiDeviceIds"),
        mdev_uuid=_uuid(d.get("mdevUUID")),
    )


def _uuid(value: object) -> str | None:
    if value is None:
        return None
    # imported here: `vfioctl list` peeks at the checkpoint without loading the mdev model
    from vfio_dp.model.mdev import is_uuid

    if not isinstance(value, str) or not is_uuid(value):
        raise ValueError(f"mdevUUID {value!r} is not a lowercase UUID")
    return value


def _claim_from_json(c: object) -> ClaimRecord:
    from vfio_dp.dra.claimpath.cdi import check_uid  # a UID reaches CDI file names: CDI's rule

    if not isinstance(c, dict):
        raise TypeError("claim must be an object")
    state = str(c.get("state", PREPARING))
    if state not in (PREPARING, PREPARED, RELEASING, SWITCHED):
        raise ValueError(f"unknown claim state {state!r}")
    pcn = c.get("podClaimName")
    devices = c.get("devices", [])
    if not isinstance(devices, list):
        raise TypeError("devices must be a list")
    return ClaimRecord(
        namespace=str(c["namespace"]),
        name=str(c["name"]),
        uid=check_uid(str(c["uid"])),
        state=state,
        boot_id=str(c.get("bootID", "")),
        pod_claim_name=None if pcn is None else str(pcn),
        devices=tuple(_device_from_json(d) for d in devices),
    )


def parse(raw: bytes) -> tuple[dict[str, ClaimRecord], dict[str, tuple[str, object]]]:
    """(records by UID, {key: (why, raw record)} of those that do not parse); a file that is
    not a checkpoint at all raises."""
    if len(raw) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version-{VERSION} checkpoint")
    body = data.get("claims")
    if not isinstance(body, dict):
        raise TypeError("claims must be an object")
    claims: dict[str, ClaimRecord] = {}
    bad: dict[str, tuple[str, object]] = {}
    for uid, c in body.items():
        try:
            rec = _claim_from_json(c)
            if rec.uid != uid:
                raise ValueError(f"claim keyed {uid!r} says uid {rec.uid!r}")
        except (ValueError, TypeError, KeyError, DraError) as e:
            bad[uid] = (f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e), c)
            continue
        claims[uid] = rec
    return claims, bad


def bad_message(path: str, key: str, why: str) -> str:
    return (
        f"DRA checkpoint {path}: record {key[:100]!r} skipped ({why}); kept as it is -- "
        "kubelet preparing or unpreparing that claim again replaces it"
    )
