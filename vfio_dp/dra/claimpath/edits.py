"""What a prepared claim leaves on the node: its CDI edits and device-metadata files.

:func:`build` is pure: from the claim, its resolved devices (:class:`Handed`: a group or an mdev instance),
their published form (:class:`~vfio_dp.dra.slices.Device`: the metadata repeats the slice's
attributes) and each group's device nodes, it makes :class:`ClaimFiles` -- one metadata file
per request (:mod:`vfio_dp.dra.claimpath.metadata`), one CDI device per group handed over plus one per
request mounting its metadata file read-only (:mod:`vfio_dp.dra.claimpath.cdi`), and kubelet's answer::

    pci-0000-3b-00-0 (request gpu) → ["<driver>/vfio=<uid>-pci-0000-3b-00-0",
                                      "<driver>/vfio=<uid>-metadata-gpu"]

The metadata mount goes with the request's first device only; ``adminAccess`` devices get
the mount and never the group. An extended-resource claim's group devices also carry their
request's ``PCI_RESOURCE_<NAME>`` / ``PCIDEVICE_<NAME>`` (:mod:`vfio_dp.dra.claimpath.extended`);
ordinary claims get no variables. :class:`ClaimDirs` writes and removes them (the one atomic
writer; metadata first, then the CDI spec that points at it); an :class:`OSError` there
(ENOSPC, EROFS, a directory where the spec goes) becomes a :class:`DraError` naming the path
and the fix (:func:`io_error`): an error of that claim only.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from vfio_dp.dra.claimpath import cdi
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.dra.claimpath.claims import AllocationResult, ClaimRef, PreparedDevice
from vfio_dp.dra.slices import Device
from vfio_dp.errors import DraError
from vfio_dp.host.atomic import sync_dir
from vfio_dp.model import dra_metadata as md

log = logging.getLogger("vfio_dp.dra.claimpath.prepare")

_FIXES = {
    errno.ENOSPC: "free space on the filesystem that holds it",
    errno.EDQUOT: "raise the quota or free space on the filesystem that holds it",
    errno.EROFS: "it is on a read-only filesystem: mount it read-write",
    errno.EACCES: "the plugin needs write access to it (run as root, check its mode)",
    errno.EPERM: "the plugin needs write access to it (run as root, check its mode)",
    errno.EISDIR: "something not made by this plugin is in the way: move it aside",
    errno.ENOTDIR: "something not made by this plugin is in the way: move it aside",
    errno.ENOTEMPTY: "something not made by this plugin is in the way: move it aside",
    errno.EEXIST: "something not made by this plugin is in the way: move it aside",
    errno.ELOOP: "a symlink is in the way: remove it",
}


def io_error(action: str, path: str, e: OSError) -> DraError:
    """A :class:`DraError` for an :class:`OSError` while ``action`` (``writing``) ``path``:
    names the path, the reason and the fix (``[Errno 28]`` alone names neither)."""
    fix = _FIXES.get(e.errno or 0, "check the path and the filesystem that holds it")
    return DraError(f"{action} {path} failed: {e.strerror or e}; {fix}")


class Handed(Protocol):
    """A result and what it gets: a PCI group (:class:`~vfio_dp.dra.claimpath.resolve.Chosen`)
    or an mdev instance (:class:`vfio_dp.dra.claimpath.mdev.Handed`)."""

    @property
    def result(self) -> AllocationResult: ...
    @property
    def gets_group(self) -> bool: ...
    @property
    def gets_nodes(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ClaimFiles:
    """One claim's files and kubelet's answer (see the module docstring)."""

    metadata: tuple[tuple[str, md.DeviceMetadata], ...]  # (host path, content) per request
    cdi_devices: tuple[cdi.CdiDevice, ...]  # the groups first, then the metadata mounts
    prepared: tuple[PreparedDevice, ...]  # in the order of the claim's results


def build(
    claim: ClaimRef,
    pod_claim_name: str | None,
    chosen: Sequence[Handed],
    *,
    driver: str,
    plugins_dir: str,
    slice_devices: Mapping[str, Device],
    group_nodes: Mapping[str, Sequence[str]],
    env: Mapping[str, Sequence[str]] | None = None,
) -> ClaimFiles:
    """The claim's files. ``slice_devices``: each chosen device's slice form (as the
    hardware is now), by name;
    ``group_nodes``: the device nodes of each group handed over, by DRA device name (a
    container entry's: its functions' own nodes on their native driver, ``/dev/nvme0n1``);
    ``env``: request → its ``NAME=value`` variables (an extended-resource claim's, from
    :func:`vfio_dp.dra.claimpath.extended.request_env`), set in full on EVERY group device of that
    request and on no other (kubelet gives a container only its requests' devices; CDI env is
    last-wins)."""
    by_request: dict[str, list[tuple[str, md.MetadataDevice]]] = {}
    for c in chosen:
        r = c.result
        mdev = md.MetadataDevice(
            driver=driver, pool=r.pool, name=r.device, attributes=slice_devices[r.device].attributes
        )
        by_request.setdefault(md.request_base(r.request), []).append((r.request, mdev))
    files = mdfile.build_claim(
        plugins_dir,
        driver,
        claim_name=claim.name,
        namespace=claim.namespace,
        uid=claim.uid,
        pod_claim_name=pod_claim_name,
        devices_by_request=by_request,
    )
    metadata_devices: list[cdi.CdiDevice] = []
    metadata_ids: dict[str, str] = {}
    for req, (host_path, container_path, _) in files.items():
        dev = cdi.CdiDevice(
            cdi.metadata_device_name(claim.uid, req),
            mounts=(cdi.Mount(host_path, container_path),),
        )
        metadata_devices.append(dev)
        metadata_ids[req] = cdi.device_id(driver, dev.name)
    group_devices: list[cdi.CdiDevice] = []
    prepared: list[PreparedDevice] = []
    given_metadata: set[str] = set()
    for c in chosen:
        r = c.result
        ids: list[str] = []
        if c.gets_group or c.gets_nodes:  # the group's /dev/vfio nodes, or its own nodes
            gdev = cdi.CdiDevice(
                cdi.group_device_name(claim.uid, r.device),
                tuple(group_nodes[r.device]),
                env=tuple((env or {}).get(r.request, ())),
            )
            group_devices.append(gdev)
            ids.append(cdi.device_id(driver, gdev.name))
        req = md.request_base(r.request)
        if req not in given_metadata:  # one mount per request (on its first device)
            given_metadata.add(req)
            ids.append(metadata_ids[req])
        prepared.append(PreparedDevice((r.request,), r.pool, r.device, tuple(ids)))
    return ClaimFiles(
        metadata=tuple((path, meta) for path, _, meta in files.values()),
        cdi_devices=(*group_devices, *metadata_devices),
        prepared=tuple(prepared),
    )


@dataclass(frozen=True, slots=True)
class ClaimDirs:
    """Where one driver's claim files go: ``<cdi-dir>/<driver>-<uid>.json`` and
    ``<plugins>/<driver>/dra-device-metadata/<uid>/``."""

    driver: str
    cdi_dir: str
    plugins_dir: str

    def write(self, uid: str, files: ClaimFiles) -> None:
        """Write the metadata files, then the CDI spec (atomically, each)."""
        for path, meta in files.metadata:
            try:
                mdfile.write_file(path, meta)
            except OSError as e:
                raise io_error("writing the device-metadata file", path, e) from e
        path = cdi.spec_path(self.cdi_dir, self.driver, uid)
        try:
            cdi.write_spec(self.cdi_dir, self.driver, uid, files.cdi_devices)
        except OSError as e:
            raise io_error("writing the CDI spec", path, e) from e

    def remove(self, uid: str, *, durable: bool = True) -> None:
        """Remove the claim's CDI spec and metadata files (absent ones are fine), each tried
        even when the other fails; :class:`DraError` naming the first path that could not be
        removed. A directory where the spec would be is someone else's: logged and left,
        never an error. ``durable=False``: the removes survive a crash once :meth:`sync`
        ran (one sync for a call's claims)."""
        failed: DraError | None = None
        path = cdi.spec_path(self.cdi_dir, self.driver, uid)
        try:
            cdi.remove_spec(self.cdi_dir, self.driver, uid, durable=durable)
        except IsADirectoryError:
            # not ours (we write files only): left as it is, and the claim is still given
            # back -- an Unprepare that failed on it would fail at every retry, forever
            log.warning(
                "%s is a directory this plugin did not make where the CDI spec of claim %s "
                "would be; left as it is (move it aside: nothing of the claim is in it)",
                path,
                uid,
            )
        except OSError as e:
            failed = io_error("removing the CDI spec", path, e)
        path = os.path.join(mdfile.claims_dir(self.plugins_dir, self.driver), uid)
        try:
            mdfile.remove_claim(self.plugins_dir, self.driver, uid, durable=durable)
        except OSError as e:
            failed = failed or io_error("removing the device-metadata files under", path, e)
        if failed is not None:
            raise failed

    def sync(self) -> None:
        """``fsync`` of the CDI directory and of the metadata claims directory: the removes
        :meth:`remove` made with ``durable=False`` survive a crash. :class:`DraError`
        naming the directory when it fails."""
        for where in (self.cdi_dir, mdfile.claims_dir(self.plugins_dir, self.driver)):
            try:
                sync_dir(where)
            except OSError as e:
                raise io_error("syncing the removes in", where, e) from e
