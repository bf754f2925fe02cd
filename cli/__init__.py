"""vfioctl — thin click commands: parse, call a library function, print. No logic here."""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "certs_cmd",
    "common",
    "completion_cmd",
    "deviceclass_cmd",
    "deviceplugin_cmd",
    "dra_cmd",
    "fake_node_cmd",
    "host_cmds",
    "inventory_cmds",
    "inventory_views",
    "kubectl_vfio",
    "main",
    "mdev_cmd",
    "sriov_cmd",
    "vm_cmds",
    "webhook_cmd",
]
