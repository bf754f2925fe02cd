"""A real :class:`~vfio_dp.host.Host` that counts its sysfs reads, for tests that show what a
flow reads (a DRA Prepare, bind/unbind/check/release) and what it does not."""

from __future__ import annotations

from typing import Any

from vfio_dp.host import Host


class CountingHost(Host):
    """A real Host that counts its sysfs reads: full scans, whole refreshes, the group reads
    of a claim (with the addresses they were given) and rereads of the devices a bind
    changed."""

    scans = 0
    refreshes = 0
    rereads = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group_reads: list[list[str]] = []

    def scan(self, *, usage: bool = True) -> Any:
        self.scans += 1
        return super().scan(usage=usage)

    def scan_groups(self, addresses: Any, *, usage: bool = True) -> Any:
        given = list(addresses)
        self.group_reads.append(sorted(map(str, given)))
        return super().scan_groups(given, usage=usage)

    def refresh(self, previous: Any) -> Any:
        self.refreshes += 1
        return super().refresh(previous)

    def reread(self, inv: Any, addresses: Any) -> Any:
        self.rereads += 1
        return super().reread(inv, addresses)
