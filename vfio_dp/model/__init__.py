"""Pure typed values and rules: no I/O, no third-party imports beyond PyYAML in config_yaml."""

# The public modules, imported on use (this __init__ stays import-light); a new module is
# listed here or named with a leading underscore (tests/test_public_names.py).
__all__ = [
    "address",
    "cdi",
    "config",
    "config_check",
    "config_fields",
    "config_yaml",
    "device",
    "devnodes",
    "dra_metadata",
    "json_depth",
    "mdev",
    "mdev_config",
    "naming",
    "parsed",
    "persist",
    "personality",
    "plan",
    "routes",
    "selector",
    "serving",
    "sriov",
    "vfio_driver",
]
