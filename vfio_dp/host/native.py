"""Switching a DRA group to its native driver (a container claim, issue 36): the two rules
:func:`vfio_dp.host.operations.unbind` adds with ``native`` (:meth:`vfio_dp.host.Host.to_native`).

- a device the kernel probed and no driver took is a failure (its native driver refused it,
  or is not loaded: ``<root>/sys/bus/pci/devices/<bdf>/driver`` absent after
  ``drivers_probe``), not "given back";
- on any failure every device of the switch is put back where it was -- the driver and
  ``driver_override`` it had (written through the operation's journal), its bind record
  (:meth:`vfio_dp.host.ledger.Ledger.put_back`) -- and the error says so: a switch that
  cannot happen leaves the device as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from vfio_dp.errors import BindError, HostError
from vfio_dp.host.bind import Binder
from vfio_dp.host.state import Operation, OriginalDriver
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import PciDevice

if TYPE_CHECKING:
    from vfio_dp.host.host import Host


def took(restored: Sequence[tuple[PciAddress, str | None]]) -> None:
    """:class:`BindError` naming each device no driver took (the kernel probed, nothing
    attached: its native driver refused it, or is not loaded)."""
    left = [a for a, now in restored if now is None]
    if left:
        raise BindError(
            "\n".join(
                f"{a}: no driver took it when the kernel probed it (its native driver refused "
                "it or is not loaded; see dmesg)"
                for a in left
            )
        )


def put_back(
    host: Host,
    op: Operation | None,
    jobs: Sequence[tuple[PciDevice, str | None, str | None]],
    before: Mapping[PciAddress, OriginalDriver | None],
    failure: BindError,
) -> None:
    """A switch to the native driver failed: every device goes back to the driver and
    override it had (journalled in ``op``), its bind record as it was; raises the failure,
    saying so. A device that cannot be put back keeps the journal, marked, as any unbind."""
    binder = Binder(host.fs, host.kernel, journal=host.ledger.journal(op))
    problems: list[str] = []
    for dev, _, _ in jobs:
        try:
            now = binder.current(dev.address)
            if (now.driver, now.driver_override) != (dev.driver, dev.driver_override):
                binder.restore_one(dev.address, dev.driver, dev.driver_override, explicit=False)
            rec = before.get(dev.address)
            if rec is not None and host.ledger.record(dev.address) != rec:
                host.ledger.put_back(rec)
        except (BindError, HostError) as e:
            problems.append(f"{dev.address}: putting it back failed: {e}")
    if problems:
        msg = "\n".join([str(failure), *problems])
        host.ledger.failed(op, msg)
        raise BindError(msg) from failure
    host.ledger.finish(op)
    left = ", ".join(f"{d.address} on {d.driver or 'no driver'}" for d, _, _ in jobs)
    raise BindError(f"{failure}\nput back as it was: {left}") from failure
