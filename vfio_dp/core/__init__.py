"""The node core shared by the kubelet front-ends (:mod:`vfio_dp.deviceplugin`, :mod:`vfio_dp.dra`).

Modules: ``options`` (the core's options and a front-end's share of them, import-light),
``frontend`` (what every front-end shares: start/stop, signals, checks at an interval),
``node`` (scan/refresh loop, uevents, resync, ``bind: true``, /healthz, the observer
interface), ``config_file`` (``--config``: changed? what it says now), ``sriov_pass`` (the
VF counts of ``numVfs`` selectors, made before every scan), ``health`` (pure: the health model of the IOMMU groups a
front-end serves — HEALTHY/UNHEALTHY/UNKNOWN, faults that say the fix, debounce),
``policy`` (the bind policy, pure), ``uevents`` (kernel netlink), ``metrics`` (/metrics,
/healthz: prometheus_client), ``logs`` (text or JSON log lines, bounded), ``sockets`` (serving gRPC on a unix socket: what may stand at the path, the
hidden-name rename, the message limits; gRPC itself is handed in).
Imports neither gRPC nor the Kubernetes client, nor any front-end (import-linter contracts).
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "config_file",
    "frontend",
    "health",
    "logs",
    "mdev_reconcile",
    "metrics",
    "node",
    "options",
    "policy",
    "sockets",
    "sriov_pass",
    "uevents",
]
