"""KEP-5304 device-metadata files on the host: one per claim and request.

Host layout (``plugins`` = ``--kubelet-plugins-dir`` as the plugin sees it, the same path on
the host, default ``/var/lib/kubelet/plugins``)::

    <plugins>/<driver>/dra-device-metadata/<claimUID>/<request>/<driver>-metadata.json

keyed by claim UID so that NodeUnprepareResources, which names the claim only by
namespace/name/UID, removes exactly its files. The CDI device of :mod:`vfio_dp.dra.claimpath.cdi`
bind-mounts each file read-only at the container path KubeVirt >= 1.8.3 reads
(:func:`vfio_dp.model.dra_metadata.container_path`). The format itself lives in
:mod:`vfio_dp.model.dra_metadata`, shared with the readers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from vfio_dp.dra.claimpath import cdi
from vfio_dp.errors import MetadataFormatError
from vfio_dp.host.atomic import remove_tree_durably, write_atomic
from vfio_dp.model import dra_metadata as md
from vfio_dp.model import naming

SUBDIR = "dra-device-metadata"


def claims_dir(plugins_dir: str, driver: str) -> str:
    """``<plugins>/<driver>/dra-device-metadata``."""
    return os.path.join(plugins_dir, cdi.check_driver(driver), SUBDIR)


def host_path(plugins_dir: str, driver: str, claim_uid: str, request: str) -> str:
    """``<plugins>/<driver>/dra-device-metadata/<claimUID>/<request>/<driver>-metadata.json``
    (``request``'s base name: ``gpu`` for ``gpu/big``)."""
    req = md.request_base(request)
    if not naming.is_dns_label(req):
        raise MetadataFormatError("<path>", f"request {req!r} is not a valid Kubernetes name")
    return os.path.join(
        claims_dir(plugins_dir, driver), cdi.check_uid(claim_uid), req, md.file_name(driver)
    )


def build_claim(
    plugins_dir: str,
    driver: str,
    *,
    claim_name: str,
    namespace: str,
    uid: str,
    pod_claim_name: str | None,
    devices_by_request: Mapping[str, Sequence[tuple[str, md.MetadataDevice]]],
) -> dict[str, tuple[str, str, md.DeviceMetadata]]:
    """The claim's metadata, one file per request (base name), without writing anything.

    ``devices_by_request`` maps a request's base name to ``(full request name, device)``
    pairs (the full name may be ``<request>/<subrequest>``). Returns
    ``{request: (host path, container path, content)}``.
    """
    out: dict[str, tuple[str, str, md.DeviceMetadata]] = {}
    for req, pairs in devices_by_request.items():
        by_name: dict[str, list[md.MetadataDevice]] = {}
        for full, dev in pairs:
            problem = naming.request_name_problem(full)
            if problem is not None:  # it goes into the JSON the VM's pod reads
                raise MetadataFormatError("<claim>", problem)
            by_name.setdefault(full, []).append(dev)
        meta = md.DeviceMetadata(
            name=claim_name,
            namespace=namespace,
            uid=uid,
            requests=tuple(md.MetadataRequest(n, tuple(d)) for n, d in by_name.items()),
            pod_claim_name=pod_claim_name,
        )
        out[req] = (
            host_path(plugins_dir, driver, uid, req),
            md.container_path(claim_name, req, driver, pod_claim_name),
            meta,
        )
    return out


def write_file(path: str, meta: md.DeviceMetadata) -> None:
    """Write (atomically replace) one metadata file: never seen torn, not synced to disk
    (every Prepare writes it anew: :mod:`vfio_dp.host.atomic`, ``durable=False``)."""
    write_atomic(path, md.render(meta).encode(), durable=False)


def write_claim(
    plugins_dir: str,
    driver: str,
    *,
    claim_name: str,
    namespace: str,
    uid: str,
    pod_claim_name: str | None,
    devices_by_request: Mapping[str, Sequence[tuple[str, md.MetadataDevice]]],
) -> dict[str, tuple[str, str]]:
    """Write one file per request (base name) of the claim (:func:`build_claim`). Returns
    ``{request: (host path, container path)}``."""
    out: dict[str, tuple[str, str]] = {}
    built = build_claim(
        plugins_dir,
        driver,
        claim_name=claim_name,
        namespace=namespace,
        uid=uid,
        pod_claim_name=pod_claim_name,
        devices_by_request=devices_by_request,
    )
    for req, (path, container, meta) in built.items():
        write_file(path, meta)
        out[req] = (path, container)
    return out


def remove_claim(plugins_dir: str, driver: str, claim_uid: str, *, durable: bool = True) -> bool:
    """Remove every metadata file of the claim (and its directories); False when none
    (``durable=False``: the caller syncs :func:`claims_dir`).

    Walks without following symlinks: only regular files and directories we created go.
    """
    top = os.path.join(claims_dir(plugins_dir, driver), cdi.check_uid(claim_uid))
    return remove_tree_durably(top, durable=durable)


def read(path: str) -> md.DeviceMetadata:
    """Read and parse one metadata file (bounded; :class:`MetadataFormatError` names it)."""
    try:
        with open(path, "rb") as f:
            data = f.read(md.MAX_BYTES + 1)
    except OSError as e:
        raise MetadataFormatError(path, f"cannot read: {e.strerror or e}") from e
    return md.parse(data, source=path)


def claim_uids(plugins_dir: str, driver: str) -> list[str]:
    """UIDs that have metadata on disk (reconcile finds leftovers of a crash with them)."""
    try:
        return sorted(os.listdir(claims_dir(plugins_dir, driver)))
    except OSError:
        return []
