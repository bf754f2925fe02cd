"""CDI specs for prepared claims: one file per claim, what the container runtime injects.

``<cdi-dir>/<driver>-<claimUID>.json`` (``cdi-dir`` as the plugin sees it, default
``/var/run/cdi``; never joined with ``--root``), ``cdiVersion`` 0.5.0 — the newest podman 4.3
accepts and enough for deviceNodes and mounts::

    {"cdiVersion": "0.5.0", "kind": "<driver>/vfio", "devices": [
      {"name": "<claimUID>-pci-0000-3b-00-0", "containerEdits": {"deviceNodes": [
          {"path": "/dev/vfio/vfio"}, {"path": "/dev/vfio/45"},
          {"path": "/dev/vfio/devices/vfio3"}, {"path": "/dev/iommu"}]}},   # cdev: kernel >= 6.6
      {"name": "<claimUID>-pci-0000-01-00-0-native", "containerEdits": {"deviceNodes": [
          {"path": "/dev/nvme0"}, {"path": "/dev/ng0n1"}, {"path": "/dev/nvme0n1"}]}},
                                # a container claim: the group's own nodes on its native driver
      {"name": "<claimUID>-metadata-nic", "containerEdits": {"mounts": [
          {"hostPath": "/var/lib/kubelet/plugins/<driver>/dra-device-metadata/<claimUID>/nic/<driver>-metadata.json",
           "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/nic/<driver>-metadata.json",
           "options": ["ro", "bind"]}]}}]}

CDI device IDs are ``<vendor>/<class>=<name>`` = ``<driver>/vfio=<name>``. Device names carry
the claim UID: CDI names must be unique per kind across every spec file, and an
``adminAccess`` claim may name a device another claim holds. No ``env`` at all: a
``PCI_RESOURCE_*`` variable here would collide with the ones KubeVirt reads for the
device-plugin path of the same VM. Paths inside a spec are HOST paths.

Pure builders plus two thin file operations through the one atomic writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from vfio_dp.errors import DraError
from vfio_dp.host.atomic import remove_durably, write_atomic
from vfio_dp.model import cdi as cdi_format
from vfio_dp.model import naming
from vfio_dp.model.cdi import CDI_CLASS, CDI_VERSION, CdiDevice, Mount

__all__ = [
    "CDI_CLASS",
    "CDI_VERSION",
    "CdiDevice",
    "Mount",
    "build_spec",
    "check_driver",
    "check_uid",
    "device_id",
    "group_device_name",
    "kind",
    "metadata_device_name",
    "read_spec",
    "remove_spec",
    "spec_path",
    "write_spec",
]


def check_uid(uid: str) -> str:
    """A claim UID safe in a file and CDI device name (:func:`naming.claim_uid_problem`), else
    :class:`DraError`: the UID comes from the kubelet and reaches a path."""
    why = naming.claim_uid_problem(uid)
    if why is not None:
        raise DraError(f"claim UID {uid!r} {why}")
    return uid


def check_driver(driver: str) -> str:
    """A usable DRA driver name (:func:`naming.check_dra_driver_name`: a DNS subdomain of at most
    63 characters that is also a CDI vendor), else :class:`~vfio_dp.errors.DriverNameError`
    (a :class:`DraError`)."""
    return naming.check_dra_driver_name(driver)


def kind(driver: str) -> str:
    """``<driver>/vfio``: the CDI ``<vendor>/<class>`` (format: :mod:`vfio_dp.model.cdi`)."""
    return cdi_format.kind(check_driver(driver))


def device_id(driver: str, name: str) -> str:
    """``<driver>/vfio=<name>``: what NodePrepareResources returns in ``cdi_device_ids``."""
    return cdi_format.device_id(check_driver(driver), name)


def group_device_name(claim_uid: str, dra_device: str) -> str:
    """``<claimUID>-pci-0000-3b-00-0``: the CDI device handing over one DRA device's group."""
    return f"{check_uid(claim_uid)}-{dra_device}"


def metadata_device_name(claim_uid: str, request: str) -> str:
    """``<claimUID>-metadata-<request>``: the CDI device mounting one request's metadata file."""
    return f"{check_uid(claim_uid)}-metadata-{request}"


def spec_path(cdi_dir: str, driver: str, claim_uid: str) -> str:
    """``<cdi-dir>/<driver>-<claimUID>.json``."""
    return os.path.join(cdi_dir, f"{check_driver(driver)}-{check_uid(claim_uid)}.json")


def build_spec(driver: str, devices: Sequence[CdiDevice]) -> dict[str, object]:
    """The spec object for one claim's devices (see module doc)."""
    return cdi_format.build_spec(check_driver(driver), devices)


def write_spec(cdi_dir: str, driver: str, claim_uid: str, devices: Sequence[CdiDevice]) -> str:
    """Write (atomically replace) the claim's spec; return its path. Never seen torn, not
    synced to disk (every Prepare writes it anew: :mod:`vfio_dp.host.atomic`,
    ``durable=False``). One line of JSON: ``indent`` runs the pure-Python encoder (~40
    calls per claim of the spec's nesting; the C encoder makes none)."""
    path = spec_path(cdi_dir, driver, claim_uid)
    data = (json.dumps(build_spec(driver, devices)) + "\n").encode()
    write_atomic(path, data, durable=False)
    return path


def remove_spec(cdi_dir: str, driver: str, claim_uid: str, *, durable: bool = True) -> bool:
    """Remove the claim's spec (``durable=False``: the caller syncs ``cdi_dir``); False when
    there was none."""
    path = spec_path(cdi_dir, driver, claim_uid)
    return bool(remove_durably(*os.path.split(path), durable=durable))


def read_spec(cdi_dir: str, driver: str, claim_uid: str) -> dict[str, object] | None:
    """The claim's spec as written, or None (a repeat Prepare compares against it)."""
    try:
        with open(spec_path(cdi_dir, driver, claim_uid), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise DraError(f"unreadable CDI spec {spec_path(cdi_dir, driver, claim_uid)}: {e}") from e
    return data if isinstance(data, dict) else None
