"""Where a VMI's DRA entries find their device: the KEP-5304 metadata path (pure).

virt-launcher (KubeVirt ≥ 1.8.3) learns a DRA host device's PCI address only from the
device-metadata file the driver had kubelet mount into the pod. For an entry
``{name: nic1, claimName: nics, requestName: nic}`` it looks in::

    <base>/resourceclaims/<resourceClaimName>/nic/*-metadata.json         # spec.resourceClaims
                                                                           #   [name: nics] names a claim
    <base>/resourceclaimtemplates/nics/nic/*-metadata.json                 # ... or a template
                                                                           #   (the VMI's claim name)

with ``<base>`` = ``/var/run/kubernetes.io/dra-device-attributes``; exactly one file and one
device per request, address from ``resource.kubernetes.io/pciBusID``. The format itself lives in
:mod:`vfio_dp.model.dra_metadata` (shared with the writer); here only the choice of directory
and the "exactly one" rules, so ``vfioctl hostdev`` agrees with the launcher. The reading is in
:func:`vm_translate.inputs.dra_addresses`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from vfio_dp.errors import AddressError, MetadataFormatError
from vfio_dp.model import dra_metadata
from vfio_dp.model.address import PciAddress
from vfio_dp.model.mdev import is_uuid
from vm_translate.allocation import MdevSource, Source
from vm_translate.entries import ClaimEntry, VmClaim
from vm_translate.errors import HostdevError

DEFAULT_BASE = dra_metadata.CONTAINER_BASE


def claim_label(entry: ClaimEntry) -> str:
    """How errors name an entry's claim: ``entry 'nic1' (claim nics, request nic)``."""
    return f"entry {entry.name!r} (claim {entry.claim_name}, request {entry.request_name})"


def metadata_dir(entry: ClaimEntry, claims: Mapping[str, VmClaim], base: str) -> str:
    """The directory holding ``entry``'s ``*-metadata.json`` (see module docstring).

    Every component is a Kubernetes name checked by :mod:`vfio_dp.model.dra_metadata` (never
    ``..`` nor containing ``/``), so the result stays under ``base``.
    """
    claim = claims.get(entry.claim_name)
    if claim is None:
        raise HostdevError(f"{claim_label(entry)}: no such claim in spec.resourceClaims")
    try:
        if claim.resource_claim_name is not None:
            inner = dra_metadata.container_dir(claim.resource_claim_name, entry.request_name)
        else:
            inner = dra_metadata.container_dir("", entry.request_name, entry.claim_name)
    except MetadataFormatError as e:
        raise HostdevError(f"{claim_label(entry)}: {e.why}") from None
    rel = posixpath.relpath(inner, dra_metadata.CONTAINER_BASE)
    return posixpath.join(base, rel)


def address_from(
    entry: ClaimEntry, files: Sequence[tuple[str, str | bytes]], directory: str
) -> Source:
    """The one device of ``entry`` from the metadata ``files`` ((path, text), found in
    ``directory``): its ``mdevUUID`` when it has one (it wins, as in KubeVirt's launcher),
    else its ``pciBusID``. Missing, several files, no device or several, or a malformed file:
    an error naming the claim, the request and the path."""
    where = claim_label(entry)
    if not files:
        raise HostdevError(
            f"{where}: no *{dra_metadata.FILE_SUFFIX} in {directory}; the DRA driver writes it "
            "when kubelet prepares the claim: check the claim is allocated and prepared "
            "(kubectl describe resourceclaim) and that --dra-metadata-dir is the pod's "
            f"{DEFAULT_BASE}"
        )
    if len(files) > 1:
        names = ", ".join(posixpath.basename(p) for p, _ in files)
        raise HostdevError(
            f"{where}: {len(files)} metadata files in {directory} ({names}); KubeVirt takes "
            "exactly one driver per request: split the request"
        )
    path, text = files[0]
    try:
        meta = dra_metadata.parse(text, path)
    except MetadataFormatError as e:
        raise HostdevError(f"{where}: {e}") from None
    devices = meta.devices_for(entry.request_name)
    if len(devices) != 1:
        raise HostdevError(
            f"{where}: {path} lists {len(devices)} devices for the request; a host device "
            "entry takes exactly one: make the request's count 1"
        )
    uuid = devices[0].mdev_uuid
    if uuid is not None:
        if not is_uuid(uuid):
            raise HostdevError(
                f"{where}: {path}: {dra_metadata.MDEV_UUID} {uuid[:64]!r} is not an mdev UUID"
            )
        return MdevSource(uuid)
    bus_id = devices[0].pci_bus_id
    if bus_id is None:
        raise HostdevError(
            f"{where}: {path}: device {devices[0].name} has no string attribute "
            f"{dra_metadata.PCI_BUS_ID} (or {dra_metadata.MDEV_UUID}); the driver must "
            "publish it"
        )
    try:
        return PciAddress.parse(bus_id)
    except AddressError as e:
        raise HostdevError(f"{where}: {path}: {dra_metadata.PCI_BUS_ID}: {e}") from None
