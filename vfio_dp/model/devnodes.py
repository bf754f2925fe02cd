"""A PCI function's own device nodes on its native driver, and the record of them: pure.

Found by :mod:`vfio_dp.host.devnodes` while the function is on its native driver (an NVMe
controller on ``nvme``: ``/dev/nvme0``, ``/dev/nvme0n1``, ``/dev/ng0n1``; a GPU on its
driver: ``/dev/dri/card0``, ``/dev/dri/renderD128``) and recorded, because on vfio-pci it
has none; a container claim (``personalities: [container]``) gets them. The record,
``<root>/var/lib/vfio_dp/devnodes/<bdf>.json``::

    {"version": 1, "address": "0000:01:00.0", "vendor": "1b36", "device": "0010",
     "driver": "nvme",
     "nodes": [{"path": "/dev/nvme0", "type": "char", "devno": "242:0", "sysfs": "nvme/nvme0"},
               {"path": "/dev/nvme0n1", "type": "block", "devno": "259:0",
                "sysfs": "nvme/nvme0/nvme0n1"}]}

A record whose IDs are not the device's now (another card in the slot) is never used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vfio_dp.model.address import PciAddress

VERSION = 1
CHAR = "char"
BLOCK = "block"
#: ``/dev/`` + DEVNAME: components of harmless characters, never ``.`` or ``..``
_DEV_PATH = re.compile(r"/dev(?:/[A-Za-z0-9_+:@.,-]{1,64}){1,4}")
_DEVNO = re.compile(r"[0-9]{1,10}:[0-9]{1,10}")
_SYSFS = re.compile(r"[A-Za-z0-9_+:@.,-]{1,64}(?:/[A-Za-z0-9_+:@.,-]{1,64}){0,7}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HEX4 = re.compile(r"[0-9a-f]{4}")


def dev_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a device node's path under ``/dev`` (None: it can)."""
    if not _DEV_PATH.fullmatch(path) or any(p in (".", "..") for p in path.split("/")):
        return "is not a plain path under /dev (at most 4 components of [A-Za-z0-9_+:@.,-])"
    return None


@dataclass(frozen=True, slots=True)
class DevNode:
    """One device node: its ``/dev`` path, ``char`` or ``block``, ``major:minor``, and the
    directory below the function's sysfs directory whose ``dev`` file named it."""

    path: str
    type: str
    devno: str
    sysfs: str

    def __post_init__(self) -> None:
        why = dev_path_problem(self.path)
        if why:
            raise ValueError(f"device node {self.path!r} {why}")
        if self.type not in (CHAR, BLOCK):
            raise ValueError(f"device node type {self.type!r} is not {CHAR} or {BLOCK}")
        if not _DEVNO.fullmatch(self.devno):
            raise ValueError(f"devno {self.devno!r} is not MAJOR:MINOR")
        if not _SYSFS.fullmatch(self.sysfs) or ".." in self.sysfs.split("/"):
            raise ValueError(f"sysfs path {self.sysfs!r} is not a plain relative path")


@dataclass(frozen=True, slots=True)
class NativeNodes:
    """The device nodes of one function on its native driver ``driver``; ``live``: read
    from sysfs just now (False: from the record, the device being elsewhere)."""

    address: PciAddress
    vendor: str
    device: str
    driver: str
    nodes: tuple[DevNode, ...]
    live: bool = True

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(n.path for n in self.nodes)


def to_json(n: NativeNodes) -> bytes:
    data = {
        "version": VERSION,
        "address": str(n.address),
        "vendor": n.vendor,
        "device": n.device,
        "driver": n.driver,
        "nodes": [
            {"path": d.path, "type": d.type, "devno": d.devno, "sysfs": d.sysfs} for d in n.nodes
        ],
    }
    return (json.dumps(data, indent=1) + "\n").encode()


def from_json(raw: bytes) -> NativeNodes:
    """Parse and check a record; ``ValueError`` saying what is wrong."""
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version-{VERSION} record of device nodes")
    for key, pattern in (("vendor", _HEX4), ("device", _HEX4), ("driver", _NAME)):
        value = data.get(key)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ValueError(f"field {key} {value!r} is not valid")
    address = data.get("address")
    nodes = data.get("nodes")
    if not isinstance(address, str) or not isinstance(nodes, list) or len(nodes) > 256:
        raise ValueError("fields address (a string) and nodes (a list) are required")
    out: list[DevNode] = []
    for i, d in enumerate(nodes):
        if not isinstance(d, dict) or set(d) != {"path", "type", "devno", "sysfs"}:
            raise ValueError(f"nodes[{i}] must have exactly path, type, devno, sysfs")
        if not all(isinstance(v, str) for v in d.values()):
            raise ValueError(f"nodes[{i}]: every field is a string")
        out.append(DevNode(d["path"], d["type"], d["devno"], d["sysfs"]))
    return NativeNodes(
        PciAddress.parse(address), data["vendor"], data["device"], data["driver"], tuple(out),
        live=False,
    )  # fmt: skip


#: sysfs classes below a function whose nodes are a side facility any kind of device may
#: register, never the device itself: a NIC's PTP hardware clock (``<bdf>/ptp/ptp0/dev`` →
#: ``/dev/ptp0``). A function with only these has no device nodes of its own for
#: ``container``: a pod given ``/dev/ptp0`` alone gets a clock, not the NIC, while the
#: switch to the native driver would hand the host a network interface (its data path is a
#: netdev, which no device node carries into a container).
AUXILIARY_CLASSES = frozenset({"ptp"})


def auxiliary(node: DevNode) -> bool:
    """Is ``node`` of an auxiliary class (:data:`AUXILIARY_CLASSES`), by its sysfs directory
    (``ptp/ptp0``, or ``<via>/ptp/ptp0``)?"""
    return any(part in AUXILIARY_CLASSES for part in node.sysfs.split("/")[:-1])


def container_problem(address: PciAddress, describe: str, found: NativeNodes | None) -> str | None:
    """Why the function at ``address`` (``describe``: how messages name it) cannot be offered
    as ``container`` (None: it can): no device nodes of its own on its native driver (nodes
    of an auxiliary class alone, :data:`AUXILIARY_CLASSES`, do not count), or none known
    (never seen on its native driver)."""
    if found is None:
        return (
            f"{describe} has not been seen on its native driver, so its device nodes are "
            "unknown: not offered as container until it is (vfioctl unbind "
            f"{address} gives it back to that driver)"
        )
    if not found.nodes:
        return (
            f"{describe} has no device nodes of its own on {found.driver} (no dev file below "
            f"/sys/bus/pci/devices/{address}): not offered as container"
        )
    if all(auxiliary(n) for n in found.nodes):
        return (
            f"{describe} has no device nodes of its own on {found.driver}, only "
            f"{', '.join(found.paths)} (a PTP clock: a side facility, not the device): not "
            "offered as container"
        )
    return None


def group_container_problem(
    endpoints: Sequence[PciAddress],
    describe: Callable[[PciAddress], str],
    found: Mapping[PciAddress, NativeNodes | None],
) -> str | None:
    """Why an IOMMU group of ``endpoints`` cannot be offered as ``container`` (None: it can):
    none of its functions has device nodes of its own known on its native driver (each
    function's reason, :func:`container_problem`). One function with nodes is enough (a
    GPU's audio function has its own, a USB controller may have none)."""
    problems = [container_problem(a, describe(a), found.get(a)) for a in endpoints]
    if all(problems):
        return "; ".join(p for p in problems if p)
    return None
