"""Durable state shared by vfioctl and the daemon, under the root.

- ``<root>/var/lib/vfio_dp/original/<bdf>.json`` — the driver a device had before we bound it::

      {"address": "0000:01:00.0", "driver": "e1000e", "driver_override": null,
       "vendor": "8086", "device": "10d3"}

  written atomically (temp file, fsync, rename, fsync of the directory), so a crash or a
  reboot between bind and unbind loses nothing; removed once the device is restored.
- ``<root>/run/vfio_dp/<bdf>.lock`` — per-device ``flock`` so concurrent vfioctl runs and the
  daemon never interleave bind steps on one device.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from vfio_dp.errors import AddressError, HostError, LockTimeoutError
from vfio_dp.host.atomic import write_atomic
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress


@dataclass(frozen=True, slots=True)
class OriginalDriver:
    address: str
    driver: str | None
    driver_override: str | None
    vendor: str
    device: str


class StateStore:
    def __init__(self, root: Root) -> None:
        self.root = root

    @property
    def state_dir(self) -> str:
        return self.root.path("var", "lib", "vfio_dp", "original")

    @property
    def lock_dir(self) -> str:
        return self.root.path("run", "vfio_dp")

    def _file(self, address: PciAddress) -> str:
        return f"{self.state_dir}/{address}.json"

    def get(self, address: PciAddress) -> OriginalDriver | None:
        import json

        try:
            with open(self._file(address), encoding="utf-8") as f:
                data = json.load(f)
            return OriginalDriver(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            raise HostError(
                f"unreadable record {self._file(address)}: {e}; "
                f"remove it and restore by hand: vfioctl unbind --driver NAME {address}"
            ) from e

    def all(self) -> dict[PciAddress, OriginalDriver]:
        """Every record, by address (unreadable files are skipped, not fatal, for scans)."""
        try:
            names = os.listdir(self.state_dir)
        except OSError:
            return {}
        out: dict[PciAddress, OriginalDriver] = {}
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                addr = PciAddress.parse(name[:-5])
                rec = self.get(addr)
            except (AddressError, HostError):
                continue
            if rec is not None:
                out[addr] = rec
        return out

    def put(self, record: OriginalDriver) -> None:
        """Write atomically: temp file + fsync + rename + fsync(dir)."""
        import json

        final = self._file(PciAddress.parse(record.address))
        write_atomic(final, json.dumps(asdict(record), sort_keys=True).encode())

    def remove(self, address: PciAddress) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file(address))

    @contextlib.contextmanager
    def locked(self, addresses: list[PciAddress], timeout: float = 10.0) -> Iterator[None]:
        """Hold the per-device locks of ``addresses`` (taken in sorted order: no deadlock)."""
        os.makedirs(self.lock_dir, exist_ok=True)
        fds: list[int] = []
        try:
            for addr in sorted(set(addresses)):
                fd = os.open(f"{self.lock_dir}/{addr}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                fds.append(fd)
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as e:
                        if e.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                        if time.monotonic() >= deadline:
                            raise LockTimeoutError(
                                f"{addr} is locked by another vfioctl or the vfio_dp daemon "
                                f"({self.lock_dir}/{addr}.lock) for over {timeout:g}s; "
                                "wait for it to finish and retry"
                            ) from None
                        time.sleep(0.05)
            yield
        finally:
            for fd in fds:
                os.close(fd)
