"""libvirt user aliases for passthrough devices: ``ua-hostdevice-<name>`` / ``ua-gpu-<name>``.

libvirt's QEMU driver accepts a user alias only when it matches ``ua-[a-zA-Z0-9_-]+`` (a ``.``
in a name once crashed virt-launcher); its ``test:///default`` driver accepts anything, so this
module is tested on its own. Every other character becomes ``-``::

    alias_for("gpu", "gpu.0")          -> "ua-gpu-gpu-0"
    alias_for("hostdevice", "nic1")    -> "ua-hostdevice-nic1"
    alias_for("hostdevice", "nvme", 1) -> "ua-hostdevice-nvme-1"   (count > 1: 0-based index)
    dra_alias_for("gpu", "gpu1")       -> "ua-dra-gpu-gpu1"         (a DRA claim's device)

Two names that sanitize to the same alias are a conflict the translator rejects at admission.
"""

from __future__ import annotations

import re
from typing import Literal

Kind = Literal["hostdevice", "gpu"]

USER_ALIAS = re.compile(r"ua-[a-zA-Z0-9_-]+")
_BAD = re.compile(r"[^a-zA-Z0-9_-]")


def sanitize(name: str) -> str:
    """Replace every character libvirt's QEMU driver refuses in an alias with ``-``."""
    return _BAD.sub("-", name)


def alias_for(kind: Kind, name: str, index: int | None = None) -> str:
    """The user alias of an entry (``index`` is set for the i-th device of a count > 1 entry)."""
    base = f"ua-{kind}-{sanitize(name)}"
    return base if index is None else f"{base}-{index}"


def dra_alias_for(kind: Kind, name: str) -> str:
    """The alias virt-launcher gives a DRA host device or GPU: ``ua-dra-<kind>-<name>``."""
    return f"ua-dra-{kind}-{sanitize(name)}"


def is_user_alias(alias: str) -> bool:
    return bool(USER_ALIAS.fullmatch(alias))
