"""vfio_dp — the node side of the VFIO passthrough toolkit.

Layers (enforced by import-linter, see pyproject.toml):
``daemon`` → ``plugin`` | ``host`` → ``model``.  ``model`` is pure typed values and
rules; ``host`` is the only code that touches ``/sys``, ``/dev`` and ``/proc`` (always
through a root path); ``plugin`` is the pure device-plugin logic; ``daemon`` wires them
to gRPC, the kubelet and kernel uevents.

This ``__init__`` stays import-light on purpose: ``vfioctl list`` must not pay for gRPC.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "core",
    "daemon",
    "dra",
    "errors",
    "host",
    "model",
    "plugin",
]
