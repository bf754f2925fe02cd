"""The node core's options, and the part of them every front-end's command takes.

Import-light on purpose: ``vfioctl plugin`` and ``vfioctl dra-plugin`` read their flags'
defaults from these dataclasses (and the front-ends' own, which derive from
:class:`FrontEndOptions`) without loading gRPC or the core.

- :class:`CoreFlags`: the core's settings a user gives, one flag each (``--root``,
  ``--config``, ``--resync``, ``--metrics-port``, ``--metrics-host``, ``--node-name``;
  uevents off only in tests);
- :class:`CoreOptions`: those plus what the front-end decides (the config ``path`` it serves,
  whether scans read host usage, its name in bind records) — what
  :class:`vfio_dp.core.node.NodeCore` takes;
- :class:`FrontEndOptions`: the base of a front-end's options
  (``vfio_dp.deviceplugin.options.Options``, ``vfio_dp.dra.options.DraOptions``); it says
  which path it serves and maps itself to :class:`CoreOptions` (:meth:`FrontEndOptions.core`)
  once for every front-end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from vfio_dp.host.bound_by import BOUND_BY_DEVICE_PLUGIN
from vfio_dp.model.config import DEVICE_PLUGIN


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreFlags:
    """The node core's settings as flags."""

    root: str = "/"
    config_path: str | None = None
    resync: float = 5.0
    metrics_port: int = 9109  # 0 disables /metrics and /healthz
    metrics_host: str = ""  # all interfaces
    uevents: bool = True
    #: this node's name: selectors with ``nodes`` apply only where it matches (None: never)
    node_name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CoreOptions(CoreFlags):
    """What :class:`~vfio_dp.core.node.NodeCore` runs with."""

    #: the path this process serves (``bind: true`` applies to that path's selectors only)
    path: str = DEVICE_PLUGIN
    #: fill ``PciDevice.in_use`` on every scan (full scans only; the DRA plugin needs it)
    usage: bool = False
    #: which front-end this process is: the runner its journals name and the holder its
    #: ``bind: true`` bind records name (``device-plugin``, ``dra-plugin``)
    front_end: str = BOUND_BY_DEVICE_PLUGIN


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontEndOptions(CoreFlags):
    """The base of a front-end's options: the core's flags, and what the front-end serves."""

    #: the config ``path`` whose selectors this front-end serves (``devicePlugin``, ``dra``)
    serves: ClassVar[str]
    #: whether the core reads host usage (``PciDevice.in_use``) on every scan
    needs_usage: ClassVar[bool] = False
    #: which front-end this is: the runner of its journals, the holder of its ``bind: true``
    #: bind records (``vfio_dp.host.bound_by.BOUND_BY_*``)
    front_end: ClassVar[str]

    def core(self) -> CoreOptions:
        flags = {f.name: getattr(self, f.name) for f in fields(CoreFlags)}
        return CoreOptions(
            **flags, path=self.serves, usage=self.needs_usage, front_end=self.front_end
        )
