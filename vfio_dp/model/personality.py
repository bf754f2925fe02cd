"""How a unit is offered on the DRA path (design.md, "What a passthrough unit is"): as VFIO
(for a VM: the group on its VFIO driver, ``/dev/vfio/<N>``) or as itself on its native
driver (for a container: its own device nodes, ``/dev/nvme0n1``). A selector's
``personalities`` lists which; pure."""

from __future__ import annotations

from enum import StrEnum


class Personality(StrEnum):  # a str: compares equal to its YAML value
    VM = "vm"
    CONTAINER = "container"
