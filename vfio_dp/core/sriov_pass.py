"""The node core's SR-IOV pass: each ``numVfs`` selector's VF count, made before every scan.

:class:`vfio_dp.core.node.NodeCore` runs :meth:`SriovPass.reconcile` before every scan while
the config asks for VFs (``numVfs`` selectors) or vfio_dp still records a count it changed
(``<root>/var/lib/vfio_dp/sriov/<pf>.json``): at start before any front-end answers the
kubelet (so the kubelet's replayed allocations find their VFs), on config reloads, hotplug
and resyncs (a refused change, a VF held, is retried). It asks the front-ends who holds which
VF (:attr:`SriovPass.vf_holds`: a prepared claim, a pod's allocation), then hands the wanted
counts of this process's path to :meth:`vfio_dp.host.sriov.Sriov.reconcile`, which writes
``<pf>/sriov_numvfs``. The VFs it made are new devices to the ``bind: true`` pass.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from vfio_dp.errors import HostError
from vfio_dp.host import Host
from vfio_dp.host.sriov import Sriov
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config

log = logging.getLogger("vfio_dp.core")

#: runs a blocking call on the core's host-I/O executor (:meth:`vfio_dp.core.node.NodeCore.run`)
Runner = Callable[..., Awaitable[Any]]


class SriovPass:
    """One process's SR-IOV reconcile: the counts of its own path's ``numVfs`` selectors."""

    def __init__(self, host: Host, *, by: str, path: str) -> None:
        #: SR-IOV count records name the front-end (``device-plugin``, ``dra-plugin``): each
        #: node process gives back only the PFs it changed (its own path's numVfs selectors)
        self.sriov = Sriov(host, by=by)
        self.path = path
        #: front-ends' holds on VFs (a prepared claim, a pod's allocation): address -> who
        self.vf_holds: list[Callable[[], Mapping[PciAddress | str, Sequence[str]]]] = []
        #: the messages of the last pass (each logged once while it repeats)
        self.said: set[str] = set()

    def needed(self, config: Config) -> bool:
        """Whether a pass has anything to do: VFs asked for, or a count of ours recorded."""
        return bool(config.wanted_vfs()) or bool(self.sriov.store.recorded())

    async def reconcile(self, config: Config, run: Runner) -> list[PciAddress]:
        """Make each named PF's VF count what ``config`` asks; return the VFs made. A
        message repeated pass after pass (a held VF) is logged once."""
        wanted = {  # only the numVfs selectors of this process's path
            pf: n
            for pf, (n, sel) in config.wanted_vfs().items()
            if config.selector_serves(sel, self.path)
        }
        made: list[PciAddress] = []
        try:
            said, made = await run(self._reconcile_sync, wanted)
        except HostError as e:
            said = [f"SR-IOV: {e}"]
        for msg in said:
            if msg not in self.said:
                (log.warning if "not set" in msg else log.info)("%s", msg)
        self.said = set(said)
        return made

    def _reconcile_sync(self, wanted: dict[PciAddress, int]) -> tuple[list[str], list[PciAddress]]:
        """On the host-I/O executor: ask the front-ends who holds which VF (a gRPC call to
        the kubelet, a checkpoint read), then :meth:`Sriov.reconcile`."""
        holds: dict[PciAddress | str, list[str]] = {}
        for hold in self.vf_holds:
            try:
                for a, who in hold().items():
                    holds.setdefault(a, []).extend(who)
            except Exception as e:  # unknown holds: hold everything (refuse, retry later)
                log.exception("a front-end could not say which VFs it holds")
                holds.setdefault("*", []).append(f"a front-end could not say ({e})")
        return self.sriov.reconcile(wanted, holds)
