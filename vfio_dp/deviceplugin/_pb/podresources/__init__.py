"""Generated kubelet PodResources API code (see scripts/gen_proto.py); used only by vfio_dp.deviceplugin.podresources."""
