"""The Container Device Interface (CDI) spec format, once, for both kubelet front-ends.

Pure: builds the JSON object of a spec file and the names in it; no I/O (the front-ends write
it through :mod:`vfio_dp.host.atomic`). The format (cncf-tags/container-device-interface
``SPEC.md``), at ``cdiVersion`` 0.5.0 — the newest podman 4.3 accepts and enough for
``deviceNodes`` and ``mounts``::

    {"cdiVersion": "0.5.0", "kind": "<vendor>/vfio", "devices": [
      {"name": "pci-0000-65-00-0", "containerEdits": {"deviceNodes": [
          {"path": "/dev/vfio/vfio"}, {"path": "/dev/vfio/50"},
          {"path": "/dev/vfio/devices/vfio3"}, {"path": "/dev/iommu"}]}},   # cdev: kernel >= 6.6
      {"name": "...", "containerEdits": {"mounts": [
          {"hostPath": "...", "containerPath": "...", "options": ["ro", "bind"]}]}}]}

Which device nodes a group needs (``/dev/vfio/<N>`` or ``noiommu-<N>``, the VFIO cdev and
``/dev/iommu`` only where the kernel has them) is the host's answer
(``Host.device_nodes``); this module only lays them out. Paths in a spec are HOST paths, the
same in the container.

Names (CDI's ``pkg/parser``): a kind is ``<vendor>/<class>``, each of letters, digits, ``.``,
``-``, ``_``, starting with a letter and ending with a letter or digit (so a DRA driver name
that starts with a digit, a valid DNS subdomain, is no CDI vendor); a device name of letters,
digits, ``-``, ``_``, ``.``, ``:``, starting and ending with a letter or digit. A
fully qualified CDI device ID is ``<vendor>/<class>=<name>`` — what a device plugin returns in
``cdi_devices`` and a DRA plugin in ``cdi_device_ids``. A device name must be unique per kind
across every spec file in the CDI directories.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from vfio_dp.errors import CdiError

CDI_VERSION = "0.5.0"
CDI_CLASS = "vfio"
#: The vendor part of the device-plugin front-end's kind: ``deviceplugin.vfio-dp.io/vfio``.
DEVICE_PLUGIN_VENDOR = "deviceplugin.vfio-dp.io"

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
#: No name of ours comes close; bounds what reaches a file name.
_MAX_NAME = 253


def check_vendor(vendor: str) -> str:
    if len(vendor) > _MAX_NAME or not _VENDOR_OR_CLASS.fullmatch(vendor):
        raise CdiError(
            f"CDI vendor {vendor!r} is not valid: use letters, digits, '.', '-', '_', "
            "starting with a letter and ending with a letter or digit"
        )
    return vendor


def check_class(cls: str) -> str:
    if len(cls) > _MAX_NAME or not _VENDOR_OR_CLASS.fullmatch(cls):
        raise CdiError(
            f"CDI class {cls!r} is not valid: use letters, digits, '.', '-', '_', starting "
            "with a letter"
        )
    return cls


def check_name(name: str) -> str:
    """A CDI device name, else :class:`CdiError` naming it."""
    if len(name) > _MAX_NAME or not _NAME.fullmatch(name):
        raise CdiError(
            f"CDI device name {name!r} is not valid: use letters, digits, '-', '_', '.', ':', "
            "starting and ending with a letter or digit"
        )
    return name


def kind(vendor: str, cls: str = CDI_CLASS) -> str:
    """``<vendor>/<class>`` (``vfio.dra.vfio-dp.io/vfio``): a spec's ``kind``."""
    return f"{check_vendor(vendor)}/{check_class(cls)}"


def device_id(vendor: str, name: str, cls: str = CDI_CLASS) -> str:
    """``<vendor>/<class>=<name>``: the fully qualified CDI device ID."""
    return f"{kind(vendor, cls)}={check_name(name)}"


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount: ``hostPath`` on the node, ``containerPath`` in the container."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ("ro", "bind")


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One CDI device: device nodes (host paths, the same in the container) and mounts."""

    name: str
    device_nodes: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    env: tuple[str, ...] = ()  # ``NAME=value`` (runtimes apply CDI env last-wins)

    def __post_init__(self) -> None:
        check_name(self.name)
        for e in self.env:
            name, sep, _ = e.partition("=")
            # names may hold '-' (KubeVirt keeps it: PCI_RESOURCE_..._MLX-VF); OCI env is KEY=value
            if not sep or not name or "\0" in e:
                raise CdiError(f"CDI device {self.name!r}: env {e[:80]!r} is not NAME=value")
        if not self.device_nodes and not self.mounts:
            # CDI rejects a device with empty edits ("invalid device, empty device edits")
            raise CdiError(f"CDI device {self.name!r} would have no edits")
        for p in (*self.device_nodes, *(m.host_path for m in self.mounts)):
            if not p.startswith("/"):
                raise CdiError(f"CDI device {self.name!r}: path {p!r} is not absolute")


def build_spec(
    vendor: str, devices: Sequence[CdiDevice], cls: str = CDI_CLASS
) -> dict[str, object]:
    """The spec object for ``devices`` under kind ``<vendor>/<class>`` (see the module doc).

    :class:`CdiError` when there is no device or a name repeats (CDI refuses both)."""
    if not devices:
        raise CdiError(f"a CDI spec of kind {kind(vendor, cls)} needs at least one device")
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        raise CdiError(f"CDI device names repeat in one spec: {names}")
    out_devices: list[dict[str, object]] = []
    for dev in devices:
        edits: dict[str, object] = {}
        if dev.device_nodes:
            edits["deviceNodes"] = [{"path": p} for p in dev.device_nodes]
        if dev.env:
            edits["env"] = list(dev.env)
        if dev.mounts:
            edits["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": list(m.options),
                }
                for m in dev.mounts
            ]
        out_devices.append({"name": dev.name, "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": kind(vendor, cls), "devices": out_devices}


def spec_file_name(vendor: str, name: str) -> str:
    """``<vendor>_<name>.json``: the file of a one-device spec (``/`` and ``..`` cannot occur:
    both parts are checked names)."""
    return f"{check_vendor(vendor)}_{check_name(name)}.json"
