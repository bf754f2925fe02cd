"""Pure device-plugin logic: what each resource lists, and how requests are answered.

No I/O, no gRPC, no protobuf (import-linter forbids them here): the functions take typed
values (:class:`~vfio_dp.model.device.Inventory`, :class:`~vfio_dp.model.config.Config`) and
return typed values; :mod:`vfio_dp.daemon` translates those to and from the wire. Kept
independent of the device-plugin API's shapes so that a DRA driver can reuse it.

- :mod:`.listing` — per-resource device lists (the IOMMU group is the unit), health, NUMA,
  conflicts, stickiness, and the human-readable changes between two listings.
- :mod:`.allocation` — Allocate, GetPreferredAllocation, and PreStartContainer verification
  against the allocation record.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "allocation",
    "listing",
    "paths",
]
