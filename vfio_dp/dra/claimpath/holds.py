"""Which PCI functions prepared DRA claims hold, read from the checkpoints on disk.

Read-only (never moves a file aside, unlike :meth:`Checkpoint.load`): SR-IOV count changes
ask it so that a VF a claim was given is never destroyed under the claim. Reads every
``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json`` (or the one ``driver``'s) through the
checkpoint's own reader and parser (:func:`vfio_dp.dra.claimpath.checkpoint.read_only`:
inside the root, never blocking on a FIFO, never following a link)::

    {"claims": {"<uid>": {"namespace": "default", "name": "vm-nic", "state": "prepared",
                          "devices": [{"addresses": ["0000:01:00.1"], ...}]}}}

An unreadable checkpoint, or one with a record that does not parse, holds EVERYTHING it
might name: its problem is returned and the caller refuses changes (``"*"`` key), rather
than guessing nobody holds anything.
"""

from __future__ import annotations

from vfio_dp.dra.claimpath.checkpoint import names, read_only
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress

#: the key under which an unreadable checkpoint is reported (holds every VF)
ANY = "*"


def checkpoint_holds(root: Root, driver: str | None = None) -> dict[PciAddress | str, list[str]]:
    """Address -> ``claim default/vm-nic (prepared, vfio.example.com)`` for each function a
    claim in a checkpoint holds; ``ANY`` -> problems with checkpoints that cannot be read."""
    out: dict[PciAddress | str, list[str]] = {}
    for name, drv in sorted(names(root).items()):
        if driver is not None and drv != driver:
            continue
        claims, problem = read_only(root, name)
        if problem is not None:
            out.setdefault(ANY, []).append(problem)
        for c in claims:
            who = f"claim {c.namespace}/{c.name} ({c.state}, {drv})"
            for d in c.devices:
                for a in d.addresses:
                    out.setdefault(PciAddress.parse(a), []).append(who)
    return out
