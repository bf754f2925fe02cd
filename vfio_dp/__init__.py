"""vfio_dp — the node side of the VFIO passthrough toolkit.

Layers (enforced by import-linter, see pyproject.toml):
``daemon`` → ``plugin`` | ``host`` → ``model``.  ``model`` is pure typed values and
rules; ``host`` is the only code that touches ``/sys``, ``/dev`` and ``/proc`` (always
through a root path); ``plugin`` is the pure device-plugin logic; ``daemon`` wires them
to gRPC, the kubelet and kernel uevents.

This ``__init__`` stays import-light on purpose: ``vfioctl list`` must not pay for gRPC.
"""
