"""The DRA plugin's kubelet-facing shell: what speaks gRPC to the kubelet.

``server`` (plugin registration, the DRAPlugin v1/v1beta1 services, ``dra.sock`` and the
registration socket) and ``health_stream`` (``DRAResourceHealth.NodeWatchResources``). The
generated protobuf code (:mod:`vfio_dp.dra._pb`) is imported here and nowhere else.
"""

__all__ = ["health_stream", "server"]
