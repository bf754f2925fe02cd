"""The DRA front-end: ``vfioctl dra-plugin`` (Kubernetes Dynamic Resource Allocation).

Modules: ``slices`` (pure: the node core's inventory → ResourceSlice objects), ``publisher``
(the Kubernetes client shell that keeps this node's slices published), ``kubelet`` (the gRPC
shell: plugin registration and the DRAPlugin v1/v1beta1 services), ``driver`` (the DRA process's lifecycle:
core + publisher + kubelet shell), ``options`` (``vfioctl dra-plugin``'s options), and the claim path, which loads no grpc: ``claims`` (pure:
kubelet's claim types, the ResourceClaim as read, its checks), ``resolve`` (pure: results →
IOMMU groups, the checks on them), ``edits`` (the CDI edits and metadata of a claim, built
purely, then written), ``prepare`` (the kubelet's Handler: NodePrepareResources as a recipe
over those), ``reconcile`` (Unprepare's release, reconcile, re-verify after a reboot),
``cdi`` (one CDI spec per claim), ``metadata`` (KEP-5304 device-metadata files; the format
is :mod:`vfio_dp.model.dra_metadata`), ``checkpoint`` (prepared claims, with the boot ID);
for health: ``health`` (pure: the pool by group state, taints, the health list) and
``health_stream`` (the gRPC shell of ``DRAResourceHealth.NodeWatchResources``),
``claim_status`` (our entries of a claim's ``status.devices``: built purely, written through
the status subresource). Generated
protobuf code lives in ``_pb`` and is imported only by ``kubelet`` and ``health_stream``.
Never imports :mod:`vfio_dp.deviceplugin` (import-linter contract), and this ``__init__``
imports nothing: grpc and the generated code only in ``kubelet`` and ``health_stream``, the
Kubernetes client only in ``publisher``.
"""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "cdi",
    "checkpoint",
    "claim_status",
    "claims",
    "deviceclasses",
    "driver",
    "edits",
    "extended",
    "health",
    "health_stream",
    "holds",
    "kubelet",
    "metadata",
    "options",
    "prepare",
    "publisher",
    "reconcile",
    "resolve",
    "slices",
]
