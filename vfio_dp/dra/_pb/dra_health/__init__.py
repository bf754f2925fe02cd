"""Generated kubelet plugin-registration / DRA API code (see scripts/gen_proto.py); used only by vfio_dp.dra.kubelet."""
