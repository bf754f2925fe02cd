"""SR-IOV virtual functions: the kernel's rules for changing a PF's VF count, as a plan.

Pure: takes what :mod:`vfio_dp.host.sriov` read from sysfs (one PF)::

    /sys/bus/pci/devices/<pf>/{sriov_totalvfs,sriov_numvfs,sriov_drivers_autoprobe,driver->}
    /sys/bus/pci/devices/<pf>/virtfn<i> -> ../<vf>

and returns the exact writes (or why not). The kernel's rules, each applied here once:

- the count changes only through 0: writing N > 0 while it is M > 0 fails (``EBUSY``), so
  going M -> N writes 0 first, which DESTROYS every VF of the PF;
- ``sriov_totalvfs`` is the ceiling;
- the PF's driver makes the VFs (its ``sriov_configure``): without a driver the write fails;
  ``vfio-pci`` makes them only when loaded with ``enable_sriov=1`` and ``pci-stub`` never;
- ``sriov_drivers_autoprobe`` = 0 before VFs are made, so no host driver touches a VF
  before it goes where the config says; restored as it was when the count is given back.

Our own rules: never change the count while any VF is held (a VM has its group open, a
claim or a pod has it) -- not even with ``force``; never touch a PF whose VFs we did not
make (an operator, a boot script) unless forced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vfio_dp.model.address import PciAddress

NUMVFS = "sriov_numvfs"
AUTOPROBE = "sriov_drivers_autoprobe"
#: PF drivers that cannot make VFs (vfio-pci only with enable_sriov=1, which it rarely has)
NO_SRIOV_DRIVERS = frozenset({"pci-stub"})


@dataclass(frozen=True, slots=True)
class PfState:
    """One SR-IOV physical function as sysfs shows it now."""

    address: PciAddress
    vendor: str
    device: str
    driver: str | None
    totalvfs: int
    numvfs: int
    autoprobe: int | None  # None: the attribute is missing
    vfs: tuple[PciAddress, ...] = ()  # virtfn0, virtfn1, ... in index order

    def describe(self) -> str:
        return f"{self.address} ({self.vendor}:{self.device}, {self.driver or 'no driver'})"


@dataclass(frozen=True, slots=True)
class SriovRecord:
    """What we did to a PF, durable until the PF is back at ``before``::

    {"address": "0000:01:00.0", "before": 0, "autoprobe_before": 1, "count": 2,
     "by": "daemon:devicePlugin"}
    """

    address: str
    before: int  # the count it had before we first changed it
    autoprobe_before: int | None
    count: int  # the count we set last
    by: str  # "operator" (vfioctl sriov set) | "daemon:<path>" (the node process of that path)


@dataclass(frozen=True, slots=True)
class Write:
    """One sysfs write to the PF: ``echo <value> > /sys/bus/pci/devices/<pf>/<attr>``."""

    attr: str  # NUMVFS | AUTOPROBE
    value: int


@dataclass(frozen=True, slots=True)
class SriovPlan:
    """The writes that take ``pf`` from ``pf.numvfs`` to ``target`` (empty: already), or the
    refusals; ``destroys`` are the VFs the first write removes, ``forced`` what ``force``
    overrode."""

    pf: PfState
    target: int
    writes: tuple[Write, ...] = ()
    refusals: tuple[str, ...] = ()
    destroys: tuple[PciAddress, ...] = ()
    forced: tuple[str, ...] = ()

    @property
    def noop(self) -> bool:
        return not self.writes and not self.refusals


def driver_problem(pf: PfState) -> str | None:
    """Why ``pf``'s driver cannot make VFs (None: it can, as far as sysfs tells)."""
    if pf.driver is None:
        return (
            f"PF {pf.describe()} has no driver, and the kernel makes VFs only through the "
            "PF's driver; load or bind its host driver first (e.g. vfioctl unbind "
            f"{pf.address}, or modprobe the driver)"
        )
    if pf.driver == "vfio-pci" or pf.driver in NO_SRIOV_DRIVERS:
        extra = " unless loaded with enable_sriov=1" if pf.driver == "vfio-pci" else ""
        return (
            f"PF {pf.describe()} is on {pf.driver}, which cannot make VFs{extra}; give the PF "
            f"back to its host driver first: vfioctl unbind {pf.address}"
        )
    return None


def plan_count(
    pf: PfState,
    target: int,
    *,
    record: SriovRecord | None,
    held: Mapping[PciAddress, Sequence[str]],
    force: bool = False,
) -> SriovPlan:
    """The writes that set ``pf``'s VF count to ``target`` (see the module docstring).

    ``record``: what we did to it before (None: we never touched it); ``held``: for each VF
    something holds, who (``/dev/vfio/61 is held open by pid 812 (qemu)``, ``claim
    default/vm-nic``). A ``target`` equal to ``record.before`` gives the PF back: autoprobe
    is then put back as it was too.
    """
    restoring = record is not None and target == record.before
    refusals: list[str] = []
    forced: list[str] = []
    if target < 0:
        refusals.append(f"a VF count is 0 or more, not {target}")
    elif target > pf.totalvfs:
        refusals.append(
            f"PF {pf.describe()} can have at most {pf.totalvfs} VFs (sriov_totalvfs), not "
            f"{target}; ask for {pf.totalvfs} or fewer"
        )
    fix_autoprobe = restoring and _autoprobe_to_put_back(pf, record)
    if refusals or (target == pf.numvfs and not fix_autoprobe):
        return SriovPlan(pf, target, refusals=tuple(refusals))
    if target > 0 and (why := driver_problem(pf)):
        refusals.append(why)
    destroys = pf.vfs if pf.numvfs > 0 and target != pf.numvfs else ()
    for vf in destroys:
        for who in held.get(vf, ()):
            refusals.append(
                f"VF {vf} of PF {pf.address} is held ({who}); changing the count would destroy "
                "it: release it first, then retry"
            )
    ours = record is not None and record.count == pf.numvfs
    if pf.numvfs > 0 and not ours and not restoring:
        why = (
            f"PF {pf.describe()} has {pf.numvfs} VFs that vfio_dp did not make (an operator, "
            "the SR-IOV operator or a boot script did)"
        )
        if force:
            forced.append(why)
        else:
            refusals.append(f"{why}; changing the count destroys them: add --force to do it")
    if refusals:
        return SriovPlan(pf, target, refusals=tuple(refusals), destroys=destroys)
    writes: list[Write] = []
    if destroys:
        writes.append(Write(NUMVFS, 0))
    if restoring and record is not None:
        if _autoprobe_to_put_back(pf, record):
            writes.append(Write(AUTOPROBE, record.autoprobe_before or 0))
    elif target > 0 and pf.autoprobe not in (None, 0):
        writes.append(Write(AUTOPROBE, 0))
    if target > 0 and target != pf.numvfs:
        writes.append(Write(NUMVFS, target))
    return SriovPlan(pf, target, tuple(writes), destroys=destroys, forced=tuple(forced))


def _autoprobe_to_put_back(pf: PfState, record: SriovRecord | None) -> bool:
    return (
        record is not None
        and record.autoprobe_before is not None
        and pf.autoprobe is not None
        and pf.autoprobe != record.autoprobe_before
    )


def record_after(plan: SriovPlan, previous: SriovRecord | None, by: str) -> SriovRecord | None:
    """The record to keep once ``plan`` is done: None when the PF is back where it was
    before we first touched it (the record is removed then)."""
    before = previous.before if previous is not None else plan.pf.numvfs
    autoprobe = previous.autoprobe_before if previous is not None else plan.pf.autoprobe
    if plan.target == before:
        return None
    return SriovRecord(str(plan.pf.address), before, autoprobe, plan.target, by)
