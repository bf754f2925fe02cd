"""Splitting a big host's device scan across processes (the CLI's full scans only).

Reading sysfs is system calls, so a second CPU halves a 4,096-function scan. The split
forks: runs 2..n of the addresses are read by children that hand their devices back over a
pipe as :mod:`marshal`-ed tuples (one value per :class:`~vfio_dp.model.device.PciDevice`
field that discovery reads, built from the dataclass's own fields), run 1 is read here
meanwhile. Invariants: the result is exactly what one process reads, in address order; a
child that fails or hands back anything odd is not trusted (its run is read again here);
a run no child can be started for (no fds, a pid limit, fork forbidden) is read here; and
nothing forks while another thread runs (a forked copy of a threaded process can deadlock),
so the daemon always reads in one process.

Everything that decides -- the process count, the size threshold, the thread check, the
fork itself -- is a parameter, so tests pass their own instead of patching this module.
"""

from __future__ import annotations

import dataclasses
import marshal
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from vfio_dp.errors import AddressError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import PciDevice

#: A scan is split across processes only from this many devices per process (a fork and
#: the hand-back cost about a millisecond; a device costs about 30 microseconds).
PARALLEL_MIN_DEVICES = 512
#: More processes than this stop paying (sysfs has its own locks).
MAX_PROCESSES = 4

Reader = Callable[[Sequence[PciAddress]], dict[PciAddress, PciDevice]]

# What a child hands back: every field discovery reads; ``in_use`` and ``original_driver``
# are filled later by the Host from usage and the durable records, never read here.
_NOT_READ = frozenset({"in_use", "original_driver"})
_WIRE = tuple(f.name for f in dataclasses.fields(PciDevice) if f.name not in _NOT_READ)
_ADDRESSES = frozenset(f.name for f in dataclasses.fields(PciDevice) if "PciAddress" in str(f.type))


def only_thread() -> bool:
    """No other thread runs in this process (``threading`` never imported counts as none)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


def read_split(
    addrs: Sequence[PciAddress],
    read: Reader,
    *,
    processes: int,
    min_per_process: int = PARALLEL_MIN_DEVICES,
    alone: Callable[[], bool] = only_thread,
    fork: Callable[[], int] = os.fork,
) -> dict[PciAddress, PciDevice]:
    """``read(addrs)``, split across up to ``processes`` processes when there are at least
    ``min_per_process`` addresses for each and ``alone()`` says no other thread runs."""
    procs = min(processes, MAX_PROCESSES, len(addrs) // min_per_process)
    if procs > 1 and alone():
        return _read_forked(list(addrs), procs, read, fork)
    return read(addrs)


def to_wire(dev: PciDevice) -> tuple[object, ...]:
    """A freshly read device as plain values for :mod:`marshal`."""
    return tuple(str(v) if isinstance(v := getattr(dev, name), PciAddress) else v for name in _WIRE)


def from_wire(t: Sequence[Any], known: dict[str, PciAddress]) -> PciDevice:
    """The device :func:`to_wire` described (``known``: the addresses already parsed)."""
    if len(t) != len(_WIRE):
        raise ValueError(f"a device on the wire has {len(t)} values, not {len(_WIRE)}")
    values = dict(zip(_WIRE, t, strict=True))
    for name in _ADDRESSES:
        if values[name] is not None:
            values[name] = known.get(values[name]) or PciAddress.parse(values[name])
    return PciDevice(**values)


def _read_forked(
    addrs: list[PciAddress], procs: int, read: Reader, fork: Callable[[], int]
) -> dict[PciAddress, PciDevice]:
    size = -(-len(addrs) // procs)
    runs = [addrs[i : i + size] for i in range(0, len(addrs), size)]
    children: list[tuple[int, int, list[PciAddress]]] = []
    mine = runs[0]
    for run in runs[1:]:
        try:
            rfd, wfd = os.pipe()
        except OSError:  # out of fds: read the rest here
            mine = mine + run
            continue
        try:
            pid = fork()
        except OSError:  # pid limit, seccomp: read it here
            os.close(rfd)
            os.close(wfd)
            mine = mine + run
            continue
        if pid == 0:  # the child: read, hand back, leave without running any cleanup
            code = 1
            try:
                os.close(rfd)
                devices = read(run)
                with open(wfd, "wb") as out:
                    out.write(marshal.dumps([to_wire(d) for d in devices.values()]))
                code = 0
            finally:
                os._exit(code)
        os.close(wfd)
        children.append((pid, rfd, run))
    found = read(mine)
    known = {str(a): a for a in addrs}
    for pid, rfd, run in children:
        with open(rfd, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        try:
            if os.waitstatus_to_exitcode(status) != 0:
                raise ValueError("reader process failed")
            for t in marshal.loads(data):
                dev = from_wire(t, known)
                found[dev.address] = dev
        except (ValueError, TypeError, EOFError, IndexError, AddressError):
            found.update(read(run))
    return {a: found[a] for a in addrs if a in found}  # address order, whoever read it
