"""The daemon's (and the webhook's) configuration: resource domain and device selectors.

YAML, usually a ConfigMap mounted at ``/etc/vfio_dp/config.yaml``::

    resourceDomain: devices.kubevirt.io     # optional, this is the default
    selectors:                              # evaluated in order; first match wins
      - vendor: "10de"                      # a string or a list; 4 hex digits
        device: ["1eb8", "1db6"]
        resourceName: gpu                   # optional; bare names get resourceDomain
        bind: true                          # bind matched devices (and group siblings)
        path: devicePlugin                  # who serves it: devicePlugin (default) or dra
      - vendor: "15b3"
        path: dra                           # published as ResourceSlices by vfioctl dra-plugin
        bind: onPrepare                     # stays on its host driver until a claim is prepared
      - class: "0108"                       # hex prefix of the 6-digit class (NVMe)
        addresses: ["0000:65:00.0"]          # explicit PCI addresses
        resourceName: example.com/nvme-a
      - subsystemVendor: "15d9"
        subsystemDevice: "0a01"
      - drivers: [vfio-pci]                 # current driver (recorded original one with bind)
      - vendor: "10de"
        path: dra
        nodes: ["node-a", "gpu-*"]          # only on these nodes (names, shell globs)
      - addresses: ["0000:01:00.0"]          # SR-IOV PFs, named one by one
        numVfs: 2                           # make 2 VFs on each; this selector takes the VFs
        resourceName: nvme-vf               # (vfDriver: vfio-pci, the default, binds them)
      - vendor: "1b36"
        sriov: pf                           # only SR-IOV PFs (vf: only VFs)
      - vendor: "15b3"
        bind: true
        vfioDriver: vfio-pci                # auto (default): the variant driver the node's
                                            # modules.alias names (mlx5_vfio_pci), else vfio-pci

Within one selector every given field must match (a list matches any of its values).
``path`` says which node process serves what the selector takes: ``devicePlugin`` (the
device-plugin daemon, ``vfioctl plugin``; the default) or ``dra`` (``vfioctl dra-plugin``).
``bind``: ``false`` (default), ``true`` (bound to vfio-pci at start and on hotplug by the
process of the selector's path) or ``onPrepare`` (only with ``path: dra``: bound when a claim
is prepared). ``nodes`` limits a selector to the nodes whose name matches one of its
patterns (``fnmatch``, case-sensitive), so one ConfigMap can move a cluster from one path to
the other node by node; a process that does not know its node name (``--node-name``,
``NODE_NAME``) skips such selectors, and so does every offline reader except where it says
otherwise (the webhook's names, :mod:`vfio_dp.model.routes`). With no configuration at all
(or no ``selectors``) every device already on a VFIO driver is served by whichever process runs —
run only one of them that way.

``vfioDriver`` says which VFIO driver a bind writes to ``driver_override`` (``bind: true``,
``onPrepare``): ``auto`` (the kernel's own rule, :mod:`vfio_dp.model.vfio_driver`),
``vfio-pci``, or a driver's name. It is never checked against a node here (the webhook
reads the config with no sysfs; nodes run different kernels): a node whose kernel cannot
serve it says so for that device (``vfioctl list -o wide --config``) and binds nothing.

SR-IOV (the habits of the SR-IOV network operator): ``numVfs`` asks a number of VFs of each
PF named in ``addresses`` (never a broad match: only named PFs are ever changed); such a
selector takes the VFs of those PFs -- never the PFs themselves -- and ``vfDriver``
(``vfio-pci``, the default, or ``none``) says where they go (``vfio-pci`` implies ``bind:
true`` unless ``bind`` says otherwise). ``sriov: pf`` / ``sriov: vf`` tells a PF from its VFs
where they share vendor:device (QEMU's NVMe does).

This module says what a configuration means (:class:`Config`; one entry of ``selectors``, its
fields and how it matches a device: :mod:`vfio_dp.model.selector`) and is the way in:
:func:`load_config_bytes`, :func:`load_config_text`, :func:`parse_config`. Reading the
file's YAML within bounds is :mod:`vfio_dp.model.config_yaml`'s job; checking the document
field by field, every problem listed with its place, :mod:`vfio_dp.model.config_check`'s.
Each field the file sets is declared once, on :class:`~vfio_dp.model.selector.Selector` or
:class:`Config`, with its YAML key, kind and docs text; how to add one:
:mod:`vfio_dp.model.config_fields`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfio_dp.model import config_yaml, naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config_fields import ACTION, DOMAIN, MDEV_ENTRIES, SELECTORS, yaml_field
from vfio_dp.model.config_yaml import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from vfio_dp.model.config_yaml import MAX_CONFIG_DEPTH as MAX_CONFIG_DEPTH
from vfio_dp.model.config_yaml import MAX_CONFIG_NODES as MAX_CONFIG_NODES
from vfio_dp.model.device import PciDevice

# one entry of ``selectors`` (its fields and matching rules) lives in vfio_dp.model.selector;
# these names are read through this module, the config's way in
from vfio_dp.model.selector import DEFAULT_SELECTOR as DEFAULT_SELECTOR
from vfio_dp.model.selector import DEVICE_PLUGIN as DEVICE_PLUGIN
from vfio_dp.model.selector import DRA as DRA
from vfio_dp.model.selector import NO_EXECUTE as NO_EXECUTE
from vfio_dp.model.selector import NO_SCHEDULE as NO_SCHEDULE
from vfio_dp.model.selector import ON_PREPARE as ON_PREPARE
from vfio_dp.model.selector import PATHS as PATHS
from vfio_dp.model.selector import TAINT_EFFECTS as TAINT_EFFECTS
from vfio_dp.model.selector import Selector as Selector

if TYPE_CHECKING:  # made by the checker (config_check) only: a config without ``mdev:`` and
    # `vfioctl list` do not load the mdev entries' model
    from vfio_dp.model.mdev_config import MdevEntry

_DEFAULT_SELECTORS: tuple[Selector, ...] = (DEFAULT_SELECTOR,)


@dataclass(frozen=True, slots=True)
class Config:
    """The whole file; ``resourceDomain`` and ``selectors`` are declared here once."""

    resource_domain: str = yaml_field(
        naming.DEFAULT_DOMAIN,
        "resourceDomain",
        DOMAIN,
        ACTION,
        "the domain of default resource names and of bare `resourceName`s",
    )
    selectors: tuple[Selector, ...] = yaml_field(
        _DEFAULT_SELECTORS,
        "selectors",
        SELECTORS,
        ACTION,
        "what is served, and how",
        default_text="without it: every device already on a VFIO driver (vfio-pci, a "
        "variant, a vendor's VFIO provider), served by whichever process runs",
    )
    mdev: tuple[MdevEntry, ...] = yaml_field(
        (),
        "mdev",
        MDEV_ENTRIES,
        ACTION,
        "mediated-device instances to make, one type per parent",
        default_text="none",
    )
    #: True without a config (or without ``selectors``): every path serves what is selected
    any_path: bool = False
    #: the node this config is read on (:meth:`for_node`); None: unknown (offline readers)
    node: str | None = None

    def for_node(self, node: str | None) -> Config:
        """This config as read on ``node``: selectors whose ``nodes`` do not match are skipped."""
        return self if node == self.node else dataclasses.replace(self, node=node)

    @property
    def node_limited(self) -> bool:
        """Does any selector apply only on some nodes?"""
        return any(s.nodes for s in self.selectors)

    def selector_serves(self, sel: Selector, path: str) -> bool:
        """Is ``sel``'s device served by the process of ``path``?"""
        return self.any_path or sel.path == path

    def select_for(self, dev: PciDevice, path: str) -> Selector | None:
        """The first matching selector if it gives ``dev`` to ``path``, else None."""
        sel = self.select(dev)
        if sel is None or not self.selector_serves(sel, path):
            return None
        return sel

    def path_of(self, dev: PciDevice) -> str | None:
        """The path of the selector that takes ``dev`` (None: nobody serves it).
        Without a config this is :data:`DEVICE_PLUGIN` (any process would serve it)."""
        sel = self.select(dev)
        return None if sel is None else sel.path

    def select(self, dev: PciDevice) -> Selector | None:
        """The first selector that matches ``dev``, or None."""
        for sel in self.selectors:
            if sel.on_node(self.node) and sel.matches(dev):
                return sel
        return None

    def resource_for(self, dev: PciDevice, path: str | None = None) -> str | None:
        """The resource name ``dev`` is advertised under, or None when no selector takes it
        (or, with ``path``, when the selector gives it to the other path)."""
        sel = self.select(dev) if path is None else self.select_for(dev, path)
        if sel is None:
            return None
        return self.name_for(sel, dev)

    def name_for(self, sel: Selector, dev: PciDevice) -> str:
        if sel.resource_name:
            return sel.resource_name
        return naming.default_resource_name(dev.vendor, dev.device, self.resource_domain)

    def would_name(self, dev: PciDevice) -> str:
        """What ``vfioctl list`` shows: the selected name, else the default name for its IDs."""
        return self.resource_for(dev) or naming.default_resource_name(
            dev.vendor, dev.device, self.resource_domain
        )

    def resources_for_ids(self, vendor: str, device: str) -> list[str]:
        """Every resource a ``vendor:device`` pair could be advertised under (for the webhook).

        Selectors that name IDs (``vendor``/``device``) and admit the pair are the
        candidates, in order; one constrained by nothing but IDs shadows everything after it
        (first match wins). Only when no ID-naming selector admits the pair do selectors
        without IDs (``class``, ``drivers``, the default) count — so address selectors
        should name the IDs of the devices they split. Selectors of both paths give names:
        a ``path: dra`` resource is requested by the same name through its DeviceClass's
        ``extendedResourceName`` (KEP-5004; ``vfioctl deviceclasses``).
        """
        vendor, device = vendor.lower(), device.lower()
        found: dict[str, None] = {}
        fallback: dict[str, None] = {}
        for sel in self.selectors:
            if not sel.admits_ids(vendor, device):
                continue
            name = sel.resource_name or naming.default_resource_name(
                vendor, device, self.resource_domain
            )
            if not (sel.vendors or sel.devices):
                fallback.setdefault(name, None)
                continue
            found.setdefault(name, None)
            if sel.ids_only:
                break
        return list(found or fallback)

    def wanted_vfs(self) -> dict[PciAddress, tuple[int, Selector]]:
        """Each PF a ``numVfs`` selector names: the VF count asked, and the selector (the
        first selector naming a PF wins, like every match)."""
        out: dict[PciAddress, tuple[int, Selector]] = {}
        for sel in self.selectors:
            if sel.num_vfs is not None:
                for pf in sel.addresses:
                    out.setdefault(pf, (sel.num_vfs, sel))
        return out

    @property
    def resource_names(self) -> list[str]:
        """Explicitly configured resource names (default-named ones depend on devices): the
        selectors' ``resourceName``s, then the device plugin's ``mdev:`` entries'."""
        names = [s.resource_name for s in self.selectors if s.resource_name]
        mdev = [e.resource_name for e in self.mdev if e.resource_name and e.path == DEVICE_PLUGIN]
        return names + [n for n in dict.fromkeys(mdev) if n not in names]


DEFAULT_CONFIG = Config(any_path=True)


def parse_config(data: object, source: str = "<config>") -> Config:
    """Check a decoded YAML/JSON document (:mod:`vfio_dp.model.config_check`); raise
    :class:`ConfigError` listing EVERY problem."""
    from vfio_dp.model.config_check import parse_config as check

    return check(data, source)


def load_config_bytes(data: bytes, source: str) -> Config:
    """Decode a config file's bytes (UTF-8, at most :data:`MAX_CONFIG_BYTES`) and parse it."""
    return load_config_text(config_yaml.decode(data, source), source)


def load_config_text(text: str, source: str) -> Config:
    """Parse YAML text (a ConfigMap file) into a :class:`Config`, within the bounds of
    :mod:`vfio_dp.model.config_yaml`."""
    return parse_config(config_yaml.load(text, source), source)
