"""``vfioctl plugin``'s options (import-light: the command reads its flags' defaults here).

The node core's flags come from :class:`vfio_dp.core.options.FrontEndOptions`; these add
where the kubelet's device-plugin directory is and whether to write CDI specs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vfio_dp.core.options import FrontEndOptions
from vfio_dp.deviceplugin.podresources import DEFAULT_SOCKET
from vfio_dp.host.bound_by import BOUND_BY_DEVICE_PLUGIN
from vfio_dp.model.config import DEVICE_PLUGIN


@dataclass(frozen=True, slots=True, kw_only=True)
class Options(FrontEndOptions):
    """``vfioctl plugin``'s options: the core's (:class:`FrontEndOptions`) and these."""

    serves: ClassVar[str] = DEVICE_PLUGIN
    front_end: ClassVar[str] = BOUND_BY_DEVICE_PLUGIN

    kubelet_dir: str = "/var/lib/kubelet/device-plugins"
    cdi_dir: str | None = None  # write CDI specs here and answer cdi_devices; None = off
    #: the kubelet's PodResources API: which VFs running pods hold (SR-IOV count changes)
    pod_resources_socket: str = DEFAULT_SOCKET
