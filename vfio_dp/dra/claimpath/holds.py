"""Which PCI functions prepared DRA claims hold, read from the checkpoints on disk.

Read-only (never moves a file aside, unlike :meth:`Checkpoint.load`): SR-IOV count changes
ask it so that a VF a claim was given is never destroyed under the claim. Reads every
``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json`` (or the one ``driver``'s)::

    {"claims": {"<uid>": {"namespace": "default", "name": "vm-nic", "state": "prepared",
                          "devices": [{"addresses": ["0000:01:00.1"], ...}]}}}

An unreadable checkpoint holds EVERYTHING it might name: its problem is returned and the
caller refuses changes (``"*"`` key), rather than guessing nobody holds anything.
"""

from __future__ import annotations

import json
import os

from vfio_dp.host.records import STATE_DIR
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress

_MAX = 64 << 20
#: the key under which an unreadable checkpoint is reported (holds every VF)
ANY = "*"


def checkpoint_holds(root: Root, driver: str | None = None) -> dict[PciAddress | str, list[str]]:
    """Address -> ``claim default/vm-nic (prepared, vfio.example.com)`` for each function a
    claim in a checkpoint holds; ``ANY`` -> problems with checkpoints that cannot be read."""
    out: dict[PciAddress | str, list[str]] = {}
    base = root.path(*STATE_DIR)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        if not (name.startswith("dra-") and name.endswith(".checkpoint.json")):
            continue
        drv = name[len("dra-") : -len(".checkpoint.json")]
        if driver is not None and drv != driver:
            continue
        path = f"{base}/{name}"
        try:
            fd = root.open(path, os.O_RDONLY)
            try:
                raw = os.read(fd, _MAX)
            finally:
                os.close(fd)
            claims = json.loads(raw).get("claims", {})
            for c in claims.values():
                who = f"claim {c.get('namespace')}/{c.get('name')} ({c.get('state')}, {drv})"
                for d in c.get("devices", ()):
                    for a in d.get("addresses", ()):
                        out.setdefault(PciAddress.parse(a), []).append(who)
        except (OSError, ValueError, TypeError, AttributeError) as e:
            out.setdefault(ANY, []).append(f"DRA checkpoint {path} cannot be read ({e})")
    return out
