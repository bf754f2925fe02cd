"""Read SR-IOV PFs from sysfs: one PF's state, or every PF under the root.

Per PF (any ``<root>/sys/bus/pci/devices/<bdf>`` with ``sriov_totalvfs``)::

    sriov_totalvfs  sriov_numvfs  sriov_drivers_autoprobe  driver ->  virtfn<i> -> ../<vf>

The counts are read by sysfs's one decimal rule (:func:`vfio_dp.host.sysfs.read_number`): a
value no kernel writes is a :class:`SysfsValueError` naming the file and the value. Changing
a count is :mod:`vfio_dp.host.sriov`.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

from vfio_dp.errors import SysfsValueError
from vfio_dp.host import sysfs
from vfio_dp.host.root import read_text
from vfio_dp.model.address import PciAddress
from vfio_dp.model.sriov import AUTOPROBE, NUMVFS, PfState

if TYPE_CHECKING:
    from vfio_dp.host.host import Host


def read_pf(host: Host, address: PciAddress) -> PfState | None:
    """The PF's SR-IOV state; None when ``address`` is gone or is not an SR-IOV PF. A count
    no kernel writes raises :class:`SysfsValueError` naming the file and the value."""
    dfd = sysfs.open_device_dir(host.fs, address)
    if dfd is None:
        return None
    try:
        total = sysfs.read_number(host.fs, address, dfd, "sriov_totalvfs")
        if total is None:
            return None
        num = sysfs.read_number(host.fs, address, dfd, NUMVFS) or 0
        auto = sysfs.read_number(host.fs, address, dfd, AUTOPROBE)
        vfs: list[tuple[int, PciAddress]] = []
        for name in os.listdir(dfd):
            if name.startswith("virtfn") and name[6:].isdigit():
                with contextlib.suppress(OSError, ValueError):
                    target = os.path.basename(os.readlink(name, dir_fd=dfd))
                    vfs.append((int(name[6:]), PciAddress.parse(target)))
        with contextlib.suppress(OSError):
            driver: str | None = None
            driver = os.path.basename(os.readlink("driver", dir_fd=dfd))
        ids = [read_text(n, dir_fd=dfd) or "0x0000" for n in ("vendor", "device")]
    finally:
        os.close(dfd)
    return PfState(
        address=address,
        vendor=ids[0].removeprefix("0x").lower(),
        device=ids[1].removeprefix("0x").lower(),
        driver=driver,
        totalvfs=total,
        numvfs=num,
        autoprobe=auto,
        vfs=tuple(a for _, a in sorted(vfs)),
    )


def list_pfs(host: Host) -> list[PfState]:
    """Every SR-IOV PF under the root, in address order (one whose counts are garbage is
    left out, and why is logged)."""
    out = []
    for addr in sysfs.list_addresses(host.fs):
        try:
            pf = read_pf(host, addr)
        except SysfsValueError as e:
            sysfs.skipped(e)
            continue
        if pf is not None:
            out.append(pf)
    return out
