"""The device-plugin front-end's CDI spec directory (``vfioctl plugin --cdi-dir``).

Holds exactly one spec per advertised unit,
``<cdi-dir>/deviceplugin.vfio-dp.io_pci-0000-65-00-0.json`` (``cdi-dir`` as the daemon sees
it, never joined with ``--root``; on a node ``/var/run/cdi``), content from
:func:`vfio_dp.deviceplugin.allocation.cdi_specs`. :meth:`SpecDir.sync` rewrites a changed spec in
place through the one atomic writer and removes the specs of units no longer advertised, so
nothing piles up (the plugin API has no Deallocate). Only files named
``<vendor>_*.json`` are ever touched: the DRA plugin's and other vendors' specs in the same
directory are left alone. Specs stay when the daemon stops (a container created while the
daemon restarts still resolves its CDI name); the next start's first sync prunes them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

from vfio_dp.host.atomic import remove_durably, write_atomic
from vfio_dp.model import cdi

log = logging.getLogger("vfio_dp.deviceplugin")


def encode(spec: Mapping[str, object]) -> bytes:
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()


class SpecDir:
    """The specs this daemon owns in one CDI directory."""

    def __init__(self, directory: str, vendor: str = cdi.DEVICE_PLUGIN_VENDOR) -> None:
        self.directory = directory
        self.vendor = cdi.check_vendor(vendor)
        self.prefix = f"{vendor}_"

    def path(self, file_name: str) -> str:
        return os.path.join(self.directory, file_name)

    def owned(self) -> set[str]:
        """File names of our specs now in the directory (none when it does not exist)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return set()
        return {n for n in names if n.startswith(self.prefix) and n.endswith(".json")}

    def _current(self, file_name: str) -> bytes | None:
        try:
            with open(self.path(file_name), "rb") as f:
                return f.read(1 << 20)
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write(self, specs: Mapping[str, Mapping[str, object]]) -> list[str]:
        """Write each spec whose file differs from it (atomically); the paths written.
        Raises :class:`OSError` naming nothing more than the OS does (callers add the path)."""
        written = []
        for name, spec in sorted(specs.items()):
            data = encode(spec)
            if self._current(name) != data:
                write_atomic(self.path(name), data)
                written.append(self.path(name))
        return written

    def sync(self, specs: Mapping[str, Mapping[str, object]]) -> tuple[list[str], list[str]]:
        """Make our part of the directory exactly ``specs``: (paths written, paths removed)."""
        written = self.write(specs)
        gone = sorted(self.owned() - set(specs))
        removed = [self.path(n) for n in remove_durably(self.directory, *gone)] if gone else []
        for p in written:
            log.info("CDI spec %s written", p)
        for p in removed:
            log.info("CDI spec %s removed (its device is no longer advertised)", p)
        return written, removed
