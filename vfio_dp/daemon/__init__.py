"""The device-plugin daemon: the gRPC shell around :mod:`vfio_dp.plugin` and :mod:`vfio_dp.host`.

Modules: ``app`` (lifecycle: scan, resync, reload, signals), ``servicer`` (protobuf ↔ typed
values, nothing else), ``kubelet`` (registration and restart detection), ``uevents`` (kernel
netlink), ``state`` (the atomically written allocation record), ``metrics`` (/metrics, /healthz).
Generated protobuf code lives in ``_pb`` and is imported only here (import-linter contract).
Import-light: nothing heavy is imported by this ``__init__``.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "app",
    "servicer",
]
