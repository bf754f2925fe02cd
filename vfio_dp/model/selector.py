"""One entry of the config's ``selectors``: which devices it takes, where, and how they are served.

::

    selectors:
      - vendor: "15b3"          # what it takes: every given field must match (a list: any of
        device: ["101e"]        #   its values); see vfio_dp.model.config for every field
        nodes: ["gpu-*"]        # where: only on these nodes
        path: dra               # how: the node process that serves it, bind, taints, SR-IOV
        bind: onPrepare

:class:`Selector` declares each field a selector entry sets once (YAML key, kind, default, docs
text: :mod:`vfio_dp.model.config_fields`) and owns the matching rules: a device
(:meth:`Selector.matches`), a ``vendor:device`` pair known without a device
(:meth:`Selector.admits_ids`, for the webhook), a node (:meth:`Selector.on_node`). What the
whole file means -- the first match wins, resource names, the PFs ``numVfs`` names -- is
:class:`vfio_dp.model.config.Config`'s.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from vfio_dp.model.address import PciAddress
from vfio_dp.model.config_fields import (
    ACTION,
    ADDRESSES,
    BIND,
    COUNT,
    DRIVERS,
    HEX4,
    HEX_PREFIX,
    MATCH,
    NODE_PATTERNS,
    PERSONALITIES,
    RESOURCE_NAME,
    VFIO_DRIVER,
    WHERE,
    one_of,
    yaml_field,
)
from vfio_dp.model.device import VFIO_PCI, PciDevice
from vfio_dp.model.personality import Personality

#: The two node processes a selector can give its devices to.
DEVICE_PLUGIN = "devicePlugin"
DRA = "dra"
PATHS = (DEVICE_PLUGIN, DRA)
ON_PREPARE = "onPrepare"
#: the effect of the taint the DRA plugin puts on a prepared device that goes bad
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"  # evicts the running pod (a VM dies): only when a selector asks
TAINT_EFFECTS = (NO_SCHEDULE, NO_EXECUTE)
SRIOV_KINDS = ("pf", "vf")
VF_DRIVERS = (VFIO_PCI, "none")
PATH_KIND = one_of(*PATHS)
TAINT_KIND = one_of(*TAINT_EFFECTS)
SRIOV_KIND = one_of(*SRIOV_KINDS, meanings={"pf": "SR-IOV PFs", "vf": "their VFs"})
VF_DRIVER_KIND = one_of(*VF_DRIVERS)


@dataclass(frozen=True, slots=True)
class Selector:
    """One entry of ``selectors``; empty tuples mean "any". Each field the file sets is
    declared here once, with its YAML key, kind and docs text (:mod:`vfio_dp.model.config_fields`:
    how to add one)."""

    vendors: tuple[str, ...] = yaml_field(
        (), "vendor", HEX4, MATCH, "the PCI vendor ID (`<bdf>/vendor`) is one of these"
    )
    devices: tuple[str, ...] = yaml_field(
        (), "device", HEX4, MATCH, "the PCI device ID (`<bdf>/device`) is one of these"
    )
    classes: tuple[str, ...] = yaml_field(  # lowercase hex prefixes of the 6-digit class
        (), "class", HEX_PREFIX, MATCH, "the class (`<bdf>/class`) starts with one (`0108`: NVMe)"
    )
    subsystem_vendors: tuple[str, ...] = yaml_field(
        (), "subsystemVendor", HEX4, MATCH, "the subsystem vendor ID (`<bdf>/subsystem_vendor`)"
    )
    subsystem_devices: tuple[str, ...] = yaml_field(
        (), "subsystemDevice", HEX4, MATCH, "the subsystem device ID (`<bdf>/subsystem_device`)"
    )
    addresses: tuple[PciAddress, ...] = yaml_field(
        (),
        "addresses",
        ADDRESSES,
        MATCH,
        "the device is one of these (with `numVfs`: the PFs whose VFs it takes)",
    )
    drivers: tuple[str, ...] = yaml_field(
        (),
        "drivers",
        DRIVERS,
        MATCH,
        "its kernel driver is one of these (with `bind`: the one recorded before the bind); "
        "`vfio-pci` also takes a device on another VFIO driver (a variant such as "
        "`mlx5_vfio_pci`, a vendor's VFIO provider)",
    )
    sriov: str | None = yaml_field(  # "pf" | "vf": only SR-IOV PFs / only VFs
        None,
        "sriov",
        SRIOV_KIND,
        MATCH,
        "only SR-IOV PFs, or only VFs (tells them apart where they share vendor:device)",
    )
    nodes: tuple[str, ...] = yaml_field(  # node-name patterns; empty = every node
        (),
        "nodes",
        NODE_PATTERNS,
        WHERE,
        "only on the nodes whose name matches one (`--node-name`, `NODE_NAME`)",
    )
    resource_name: str | None = yaml_field(  # fully qualified when set
        None,
        "resourceName",
        RESOURCE_NAME,
        ACTION,
        "the name its devices are advertised under",
        default_text="`<resourceDomain>/<vendor>_<device>`",
    )
    path: str = yaml_field(
        DEVICE_PLUGIN,
        "path",
        PATH_KIND,
        ACTION,
        "the node process that serves it: `vfioctl plugin` or `vfioctl dra-plugin`",
    )
    bind: bool = yaml_field(  # bound to vfio-pci at start / hotplug
        False,
        "bind",
        BIND,
        ACTION,
        "`true`: bind its devices and their IOMMU groups to vfio-pci at start and on hotplug; "
        "`onPrepare` (only with `path: dra`): when a claim is prepared",
    )
    bind_on_prepare: bool = False  # ``bind: onPrepare`` (only with path: dra)
    taint_effect: str = yaml_field(
        NO_SCHEDULE,
        "taintEffect",
        TAINT_KIND,
        ACTION,
        "only with `path: dra`: the taint on a prepared device that goes bad "
        "(`NoExecute` evicts the pod)",
    )
    num_vfs: int | None = yaml_field(  # the VFs each PF in ``addresses`` should have
        None,
        "numVfs",
        COUNT,
        ACTION,
        "make this many VFs on each PF in `addresses`; the selector takes the VFs",
    )
    vf_driver: str = yaml_field(
        VFIO_PCI,
        "vfDriver",
        VF_DRIVER_KIND,
        ACTION,
        "only with `numVfs`: where the VFs go (`vfio-pci` implies `bind: true`)",
    )
    vfio_driver: str = yaml_field(
        "auto",
        "vfioDriver",
        VFIO_DRIVER,
        ACTION,
        "the VFIO driver a bind writes: `auto` (the variant the node's `modules.alias` names, "
        "else vfio-pci), `vfio-pci`, or that driver; never checked at load "
        "([below](#which-vfio-driver-vfiodriver))",
    )

    personalities: tuple[Personality, ...] = yaml_field(
        (Personality.VM,),
        "personalities",
        PERSONALITIES,
        ACTION,
        "only with `path: dra`: how its groups are offered; `container` needs `bind: "
        "onPrepare` and a device with device nodes of its own "
        "([Containers and VMs from one pool](dra.md#containers-and-vms-from-one-pool))",
        default_text="`[vm]`",
    )

    def on_node(self, node: str | None) -> bool:
        """Does this selector apply on ``node`` (None: a process that does not know it)?"""
        if not self.nodes:
            return True
        return node is not None and any(fnmatch.fnmatchcase(node, p) for p in self.nodes)

    @property
    def binds(self) -> bool:
        """Does vfio_dp move this selector's devices to vfio-pci (now or at Prepare)?"""
        return self.bind or self.bind_on_prepare

    def matches(self, dev: PciDevice) -> bool:
        """Does this selector take ``dev``? With ``bind``, ``drivers`` is checked against the
        driver recorded before the bind, so a device keeps its selection once it is moved."""
        if self.vendors and dev.vendor not in self.vendors:
            return False
        if self.devices and dev.device not in self.devices:
            return False
        if self.classes and not any(dev.class_code.startswith(c) for c in self.classes):
            return False
        if self.subsystem_vendors and dev.subsystem_vendor not in self.subsystem_vendors:
            return False
        if self.subsystem_devices and dev.subsystem_device not in self.subsystem_devices:
            return False
        if self.num_vfs is not None:  # takes the VFs of the PFs it names, never the PFs
            if dev.physfn is None or dev.physfn not in self.addresses:
                return False
        elif self.addresses and dev.address not in self.addresses:
            return False
        if self.sriov == "pf" and dev.sriov_numvfs is None:
            return False
        if self.sriov == "vf" and dev.physfn is None:
            return False
        if self.drivers:
            driver = dev.driver
            if self.binds and dev.original_driver is not None:
                driver = dev.original_driver
            # vfio-pci stands for every VFIO driver (design: one notion of "on VFIO"), so the
            # default selector serves a device a variant or a vendor provider registered too
            if driver not in self.drivers and not (
                VFIO_PCI in self.drivers and driver == dev.driver and dev.on_vfio
            ):
                return False
        return True

    def admits_ids(self, vendor: str, device: str) -> bool:
        """Could a device with these IDs match (fields not knowable from IDs are ignored)?"""
        return (not self.vendors or vendor in self.vendors) and (
            not self.devices or device in self.devices
        )

    @property
    def ids_only(self) -> bool:
        """True when nothing but vendor/device IDs constrains the selector."""
        return not (
            self.classes
            or self.subsystem_vendors
            or self.subsystem_devices
            or self.addresses
            or self.drivers
            or self.sriov
            or self.num_vfs is not None
        )


#: the selector of a file without ``selectors`` (or no file): every device on a VFIO driver
DEFAULT_SELECTOR = Selector(drivers=(VFIO_PCI,))
