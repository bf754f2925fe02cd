"""The DRA front-end: ``vfioctl dra-plugin`` (Kubernetes Dynamic Resource Allocation).

One room per job (docs/architecture.md, "The DRA plugin's rooms"):

- ``plugin`` — the process's lifecycle: node core + API-server shell + kubelet shell, wired.
- ``kubeletapi`` — the kubelet-facing gRPC shell: plugin registration, the DRAPlugin v1/v1beta1
  services, the ``DRAResourceHealth`` stream. The only importer of the generated code (``_pb``).
- ``apiserver`` — the Kubernetes-API shell: ResourceSlice publication, claim reads, the claim
  status writer. The only importer of the ``kubernetes`` package on the DRA side.
- ``claimpath`` — Prepare, Unprepare and reconcile as recipes over pure helpers, with the files
  a claim leaves (CDI spec, device metadata) and the checkpoint. Loads no gRPC.
- ``observers`` — what the node's state means for the pool: the health model by group state.
- ``slices``, ``personalities``, ``mdev_slices``, ``deviceclasses`` (pure builders), ``options`` (the
  command's options).

Never imports :mod:`vfio_dp.deviceplugin` (import-linter contract), and this ``__init__``
imports nothing.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "apiserver",
    "claimpath",
    "deviceclasses",
    "kubeletapi",
    "mdev_slices",
    "observers",
    "options",
    "personalities",
    "plugin",
    "slices",
]
