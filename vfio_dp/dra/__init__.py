"""The DRA front-end: kubelet DRA plugin (registration, DRAPlugin v1/v1beta1) and ResourceSlices.

Import-light: grpc and the generated code are imported only by ``vfio_dp.dra.kubelet``.
"""
