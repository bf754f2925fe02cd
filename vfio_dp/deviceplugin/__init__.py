"""The device-plugin front-end: the kubelet device-plugin API (v1beta1) over the node core.

Pure logic (no I/O, no gRPC): ``listing`` (per-resource device lists, the IOMMU group as the
unit, health, NUMA, conflicts) and ``allocation`` (Allocate, GetPreferredAllocation,
PreStartContainer against the record); ``allocation_store`` keeps that record on disk
(``var/lib/vfio_dp/allocations.json``, written atomically through the root).
Modules: ``app`` (lifecycle, the core's observer, Allocate and PreStartContainer over the
listing), ``kubelet`` (sockets per resource, registration, kubelet-restart detection), ``options`` (``vfioctl plugin``'s options), ``cdi`` (the CDI spec directory of ``--cdi-dir``), ``servicer``
(protobuf ↔ typed values, nothing else), ``podresources`` (a client of the kubelet's
PodResources API: which devices running pods hold). Scanning, config
reload, uevents, ``bind: true`` and metrics live in :mod:`vfio_dp.core`. Generated protobuf code lives in ``_pb`` and is imported only here
(import-linter contract); never imports :mod:`vfio_dp.dra`.
Import-light: nothing heavy is imported by this ``__init__``.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "allocation",
    "allocation_store",
    "app",
    "cdi",
    "kubelet",
    "listing",
    "mdevs",
    "options",
    "podresources",
    "servicer",
]
