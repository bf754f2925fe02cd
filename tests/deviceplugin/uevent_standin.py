"""A stand-in for the kernel's uevent netlink source, as the daemon's pyudev monitor sees it.

Named for what it is: not the kernel. The real source (``pyudev.Monitor.from_netlink(ctx,
source='kernel')`` + ``filter_by('pci')``) cannot be fed here -- libudev drops any message on
the kernel group that the kernel itself did not send, and provoking real events would mean
rebinding this machine's own devices (the guest rig does that on a real kernel). So this
carries the kernel's own datagram format over a datagram socket pair::

    unbind@/devices/pci0000:00/0000:00:1d.0/0000:65:00.0\\0ACTION=unbind\\0
    DEVPATH=/devices/pci0000:00/0000:00:1d.0/0000:65:00.0\\0SUBSYSTEM=pci\\0SEQNUM=7\\0

and offers what the daemon uses of pyudev's ``Monitor``: ``fileno()`` (readable when a message
waits) and ``poll(timeout)`` returning one device (``action``, ``sys_name``, ``subsystem``) or
None when nothing waits; messages of other subsystems are dropped as ``filter_by('pci')``
drops them. A message not in the kernel's format is a test bug and raises.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class UeventDevice:
    action: str
    sys_name: str  # the last DEVPATH component, e.g. 0000:65:00.0
    subsystem: str
    device_path: str


class KernelUeventStandin:
    def __init__(self) -> None:
        self._rx, self._tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._rx.setblocking(False)
        self._seqnum = 0

    def fileno(self) -> int:
        return self._rx.fileno()

    def emit(self, action: str, devpath: str, subsystem: str = "pci") -> None:
        """Send the datagram the kernel sends for ``action`` on ``devpath``."""
        self._seqnum += 1
        fields = [
            f"{action}@{devpath}",
            f"ACTION={action}",
            f"DEVPATH={devpath}",
            f"SUBSYSTEM={subsystem}",
            f"SEQNUM={self._seqnum}",
        ]
        self._tx.send("\0".join(fields).encode() + b"\0")

    def poll(self, timeout: float | None = None) -> UeventDevice | None:
        if timeout != 0:
            raise AssertionError("the daemon polls without blocking (timeout=0)")
        while True:
            try:
                data = self._rx.recv(8192)
            except BlockingIOError:
                return None
            dev = _parse(data)
            if dev.subsystem == "pci":
                return dev

    def close(self) -> None:
        self._rx.close()
        self._tx.close()


def _parse(data: bytes) -> UeventDevice:
    header, *pairs = data.rstrip(b"\0").decode().split("\0")
    head_action, sep, head_path = header.partition("@")
    props = dict(p.split("=", 1) for p in pairs)
    if not sep or set(props) != {"ACTION", "DEVPATH", "SUBSYSTEM", "SEQNUM"}:
        raise AssertionError(f"not a kernel uevent: {data!r}")
    if (props["ACTION"], props["DEVPATH"]) != (head_action, head_path):
        raise AssertionError(f"header and properties disagree: {data!r}")
    return UeventDevice(
        props["ACTION"], props["DEVPATH"].rsplit("/", 1)[-1], props["SUBSYSTEM"], head_path
    )
