"""vfio_dp — the node side of the VFIO passthrough toolkit.

Layers (enforced by import-linter, see pyproject.toml):
``deviceplugin`` | ``dra`` → ``core`` → ``host`` → ``model``.

- ``model`` — pure typed values and rules (addresses, devices, config, naming, who serves
  which device: :mod:`vfio_dp.model.serving`, bind/unbind plans, CDI and metadata formats).
- ``host`` — the only code that touches ``/sys``, ``/dev`` and ``/proc``, always through a
  root path (:class:`vfio_dp.host.Host`).
- ``core`` — what both kubelet front-ends share: config and reload, the scan/uevent loop,
  the ``bind: true`` policy, health, metrics.
- ``deviceplugin`` — the kubelet device-plugin front-end (``vfioctl plugin``): its pure
  listing and allocation logic, its allocation record, its gRPC shell.
- ``dra`` — the kubelet DRA front-end (``vfioctl dra-plugin``): ResourceSlices, claims,
  CDI specs, device metadata, its gRPC shell.

The two front-ends never import each other. This ``__init__`` stays import-light on
purpose: ``vfioctl list`` must not pay for gRPC.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "core",
    "deviceplugin",
    "dra",
    "errors",
    "host",
    "model",
]
