"""``vfioctl dra-plugin``'s options (import-light: the command reads its flags' defaults here).

The node core's flags come from :class:`vfio_dp.core.options.FrontEndOptions`; these add the
node and driver names and the kubelet's and the container runtime's directories (paths as
this process sees them, never joined with ``--root``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from vfio_dp.core.options import FrontEndOptions
from vfio_dp.host.bound_by import BOUND_BY_DRA_PLUGIN
from vfio_dp.model import naming
from vfio_dp.model.config import DRA


@dataclass(frozen=True, slots=True, kw_only=True)
class DraOptions(FrontEndOptions):
    """``vfioctl dra-plugin``'s options: the core's (:class:`FrontEndOptions`) and these."""

    serves: ClassVar[str] = DRA
    needs_usage: ClassVar[bool] = True  # a group a host process uses is not published
    front_end: ClassVar[str] = BOUND_BY_DRA_PLUGIN

    node_name: str
    driver_name: str = naming.DEFAULT_DRA_DRIVER
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    plugins_dir: str = "/var/lib/kubelet/plugins"
    cdi_dir: str = "/var/run/cdi"  # Prepare writes one CDI spec per claim here
    metrics_port: int = 9110  # the device-plugin daemon holds 9109 on the same host network
    #: publish binding conditions where the API keeps them (``--binding-conditions``), and
    #: watch the claims allocated from our pool to switch their devices ahead of the pod and
    #: write ``<driver>/ready`` or ``<driver>/failed`` (:mod:`vfio_dp.dra.claimpath.ahead`)
    binding_conditions: bool = True
    #: seconds in which each prepared claim is read again from the API server (spread over
    #: the resyncs, the least recently read first): a claim deleted, re-created or
    #: deallocated that kubelet never unprepared is released within this. Every claim is
    #: read at start, before kubelet can call; 0 reads every claim at every resync
    claim_check: float = 300.0
