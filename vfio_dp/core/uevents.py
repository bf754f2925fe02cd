"""Kernel PCI uevents (a device added, removed, bound, unbound) as a wake-up for a rescan.

Listens to the **kernel** netlink source with pyudev (``source='kernel'``): udev's source
only carries what a running udevd re-broadcasts, and many nodes' containers and the guest rig
run none. The socket is read on the event loop (``add_reader``), no thread. Kernel uevents
reach only sockets in the host's network namespace, so the DaemonSet needs ``hostNetwork:
true`` for them; without them (or under a temp tree in tests) the periodic resync still
converges. Events are only a trigger: the truth is always re-read from
``<root>/sys/bus/pci/devices``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("vfio_dp.core")


class UeventSource:
    def __init__(self, on_event: Callable[[str], None]) -> None:
        self.on_event = on_event
        self.monitor: Any = None
        self.fd: int | None = None

    def start(self, loop: asyncio.AbstractEventLoop, monitor: Any = None) -> bool:
        """Open the netlink socket; False (logged) when that is impossible here.

        ``monitor``: an already started source with pyudev's ``Monitor`` interface
        (``fileno()``, ``poll(timeout)`` returning a device with ``action`` and ``sys_name``,
        or None) instead of the kernel's netlink socket -- a test's stand-in."""
        if monitor is None:
            try:
                import pyudev

                monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
                monitor.filter_by("pci")
                monitor.start()
            except Exception as e:  # pyudev raises OSError, ImportError, or its own errors
                log.warning("kernel uevents unavailable (%s); relying on the periodic resync", e)
                return False
        self.monitor = monitor
        self.fd = monitor.fileno()
        loop.add_reader(self.fd, self._drain)
        log.info("listening for kernel PCI uevents on netlink (pyudev, source=kernel)")
        return True

    def _drain(self) -> None:
        while True:
            try:
                device = self.monitor.poll(timeout=0)
            except OSError as e:  # ENOBUFS: events were lost — rescan anyway
                log.warning("uevent socket: %s; rescanning", e)
                self.on_event("overflow")
                return
            if device is None:
                return
            self.on_event(f"{device.action} {device.sys_name}")

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.fd is not None:
            loop.remove_reader(self.fd)
            self.fd = None
        self.monitor = None
