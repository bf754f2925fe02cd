"""How the host layer changes the kernel's state: sysfs writes and ``modprobe``.

:class:`RealKernel` writes for real; tests inject a simulator of the kernel's documented
reaction to each write (``tests/kernel_sim.py``), cross-checked by the real-kernel tests in
the QEMU guest. Unbinding can block for a long time (a driver waiting for its user to let
go), so every write runs with a timeout.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from vfio_dp.errors import BindError, WriteTimeoutError

if TYPE_CHECKING:
    import queue


class KernelIO(Protocol):
    def write(self, path: str, data: str) -> None:
        """Write ``data`` to the sysfs file ``path`` in one ``write(2)``; raise OSError."""

    def modprobe(self, module: str) -> None:
        """Load a kernel module; raise BindError when it cannot be loaded."""


def _work(jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
    while True:
        jobs.get()()


class RealKernel:
    """The real kernel: one ``write(2)`` per sysfs write, ``modprobe`` for modules.

    Writes run on worker threads so the caller can give up after ``timeout``. Workers are
    kept and reused (starting a thread per write is measurable under emulation); there are
    as many as writes ever ran at once (devices restored concurrently each need one). A write
    that hangs strands its worker -- a thread blocked in the kernel cannot be killed -- and
    that worker is never handed out again.
    """

    def __init__(
        self,
        root_prefix: str = "",
        timeout: float = 10.0,
        opener: Callable[[str, int], int] | None = None,
    ) -> None:
        """``opener(path, flags)`` opens each sysfs file (the host passes
        :meth:`~vfio_dp.host.root.Root.open`, which never follows a link out of the root)."""
        self.root_prefix = root_prefix
        self.timeout = timeout
        self.opener = opener or os.open
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def _worker(self) -> queue.SimpleQueue[Callable[[], None]]:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        import queue  # on the first write: a read-only command never needs it

        jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=_work, args=(jobs,), name="sysfs-writer", daemon=True).start()
        return jobs

    def write(self, path: str, data: str) -> None:
        result: list[BaseException | None] = []
        done = threading.Event()

        def do() -> None:
            try:
                fd = self.opener(path, os.O_WRONLY)
                try:
                    os.write(fd, data.encode())
                finally:
                    os.close(fd)
                result.append(None)
            except BaseException as e:  # handed to the caller's thread
                result.append(e)
            finally:
                done.set()

        jobs = self._worker()
        jobs.put(do)
        if not done.wait(self.timeout):  # that worker is stuck in the kernel: never reuse it
            raise WriteTimeoutError(
                f"writing {data.strip()!r} to {path} did not return in {self.timeout:g}s; a "
                "process probably holds the device open (a VM, or a host tool): find it with "
                "`fuser -v /dev/vfio/*` and stop it"
            )
        with self._lock:
            self._idle.append(jobs)
        if result and result[0] is not None:
            raise result[0]

    def modprobe(self, module: str) -> None:
        import subprocess  # only when a module must be loaded

        cmd = ["modprobe"]
        if self.root_prefix:
            cmd += ["-d", self.root_prefix]
        cmd.append(module)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BindError(f"could not run {' '.join(cmd)}: {e}") from e
        if proc.returncode != 0:
            raise BindError(
                f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.returncode}; "
                f"is the {module} module installed for the running kernel?"
            )
