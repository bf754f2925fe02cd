"""A claim's steps over its devices, shared by Prepare (:mod:`.prepare`) and the switch
ahead of its pod (:mod:`.ahead`): the one place that reads, checks and moves a claim's
IOMMU groups.

1. :meth:`DeviceSteps.resolve`: the claim's groups read fresh from sysfs (only those:
   :meth:`vfio_dp.host.Host.scan_groups`), each result paired with its group;
2. :meth:`DeviceSteps.check`: before anything is touched, a group held in the other
   personality or by someone this claim may not take it from is refused
   (:func:`.native.check`; a pool hold, ``pool:<driver>`` in
   ``<root>/var/lib/vfio_dp/original/<bdf>.json``: :func:`vfio_dp.host.bound_by.pool_refusal`);
3. :meth:`DeviceSteps.take`: ``bind: onPrepare`` groups not on VFIO bound in ONE
   :meth:`vfio_dp.host.Host.bind` (holder ``claim:<uid>``, never ``probe``), the records a
   stale claim or the claim's own pool left on its groups taken over
   (:func:`vfio_dp.host.bound_by.claim_takes`), container groups put on their native driver
   and their device nodes waited for (:func:`.native.switch`);
4. :meth:`DeviceSteps.verify`: each group where the claim needs it.

:meth:`DeviceSteps.moves` says whether step 3 will touch the machine (the caller records the
claim durably first). All blocking.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from vfio_dp.dra.claimpath import native, resolve
from vfio_dp.dra.claimpath.checkpoint import ClaimRecord
from vfio_dp.dra.claimpath.claims import AllocationResult
from vfio_dp.dra.claimpath.edits import io_error
from vfio_dp.dra.claimpath.resolve import Chosen
from vfio_dp.dra.slices import Device
from vfio_dp.errors import ClaimError, VfioError
from vfio_dp.host import Host
from vfio_dp.host.bound_by import bound_by_claim, claim_takes
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vfio_dp.model.device import Inventory
from vfio_dp.model.devnodes import NativeNodes
from vfio_dp.model.serving import dra_units


class DeviceSteps:
    """The steps over one claim's devices (module doc), for one DRA driver's claims."""

    def __init__(
        self,
        *,
        host: Host,
        driver: str,
        config: Callable[[], Config],
        published: Callable[[], Mapping[str, Device]] | None,
        node_timeout: float,
    ) -> None:
        self.host = host
        self.driver = driver
        self.config = config
        self.published = published
        self.node_timeout = node_timeout

    def resolve(
        self, who: str, uid: str, wanted: Sequence[AllocationResult]
    ) -> tuple[Inventory, tuple[Chosen, ...]]:
        """Read the claim's IOMMU groups (only those: :meth:`Host.scan_groups`, fresh, with
        host use) and pair each result with its group. A result's device names its group's
        first endpoint (``pci-0000-3b-00-0``); a name that is not one, or whose group has
        another first endpoint now, has no unit here: "no such device"."""
        named = (naming.dra_device_address(naming.dra_entry(r.device)[0]) for r in wanted)
        inv = self.host.scan_groups([a for a in named if a is not None])
        units = {u.name: u for u in dra_units(inv, self.config())}
        mine: set[PciAddress] = set()
        if any(not u.published for u in units.values()):
            mine = set(self.host.holdings(bound_by_claim(uid)))
        chosen = resolve.resolve(
            who, wanted, units, inv, lambda unit: any(a in mine for a in unit.endpoints)
        )
        return inv, chosen

    def check(
        self,
        claims: Mapping[str, ClaimRecord],
        who: str,
        uid: str,
        chosen: Sequence[Chosen],
        inv: Inventory,
    ) -> dict[PciAddress, tuple[str, ...]]:
        """Refusals before anything is touched (:func:`.native.check`, ``claims``: the
        checkpoint's); → the device nodes each container function is known to have."""
        return native.check(self.host, claims, who, uid, chosen, inv, self.driver)

    @staticmethod
    def moves(chosen: Sequence[Chosen], inv: Inventory) -> bool:
        """Will :meth:`take` bind a group or switch one to its native driver?"""
        return bool(resolve.to_bind(chosen, inv)) or bool(native.to_switch(chosen, inv))

    def take(
        self,
        who: str,
        uid: str,
        chosen: Sequence[Chosen],
        inv: Inventory,
        expected: Mapping[PciAddress, Sequence[str]],
    ) -> tuple[Inventory, dict[PciAddress, NativeNodes]]:
        """Bind what ``bind: onPrepare`` groups are not on VFIO yet (and re-read those, only
        then); a group another (stale, not yet reconciled) claim bound, or the claim's pool
        holds, becomes this claim's, so the stale claim's release never gives back a group
        this claim hands to its pod. Operator and front-end bindings stay theirs. Then the
        container groups on their native driver (:func:`.native.switch`). → the groups as
        they are now, and the device nodes found."""
        holder = bound_by_claim(uid)
        targets = resolve.to_bind(chosen, inv)
        if targets:
            names = ", ".join(c.unit.name for c in chosen if c.unit.primary in targets)
            try:
                self.host.bind(
                    targets, group=True, probe=False, bound_by=holder,
                    inventory=inv,  # the claim's groups as just read (planned again under locks)
                    vfio_driver={a: c.unit.vfio_driver for c in chosen for a in c.unit.endpoints},
                    mdev=self.config().mdev,
                )  # fmt: skip
            except VfioError as e:
                raise ClaimError(
                    who, f"binding the IOMMU group to its VFIO driver failed: {e}", names
                ) from e
            # the bound groups' drivers, overrides and cdevs; no other device is read again
            inv = self.host.reread(inv, targets)
        try:
            self.host.adopt(
                resolve.handed_over(chosen), holder,
                replacing=lambda h: claim_takes(h, self.driver),
            )  # fmt: skip
        except OSError as e:
            path = self.host.state_file("original")
            raise io_error("writing the bind records in", path, e) from e
        return native.switch(self.host, who, chosen, inv, expected, self.node_timeout)

    def verify(self, who: str, chosen: Sequence[Chosen], inv: Inventory) -> None:
        """Each VFIO group viable, on VFIO, with its published number; each container group
        on its native drivers."""
        resolve.verify(who, chosen, inv, self.published() if self.published else None)
        native.verify(who, chosen, inv)
