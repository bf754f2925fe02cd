"""Devices as a DRA CEL expression sees them, and expressions evaluated with cel-python.

``device.driver``, ``device.attributes[<domain>][<identifier>]`` (bare attribute names are in
the driver's domain, values unwrapped from ``{"string": ...}``), as the scheduler evaluates
DeviceClass and request selectors. Used to check that what we generate (DeviceClasses,
``translate --dra`` templates) selects exactly what the DRA plugin publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from vfio_dp.dra.slices import published_devices
from vfio_dp.host import Host
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.config import Config


def cel(expression: str) -> Callable[[dict[str, Any]], bool]:
    """A compiled CEL expression over one ``device`` (an error evaluating it is a test
    failure, not a silent False: the scheduler would fail the allocation)."""
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    env = celpy.Environment()
    program = env.program(env.compile(expression))

    def run(device: dict[str, Any]) -> bool:
        result = program.evaluate({"device": celpy.json_to_cel(device)})
        assert not isinstance(result, Exception), f"{expression} on {device['name']}: {result}"
        return bool(result)

    return run


def cel_view(devices: Sequence[dict[str, Any]], driver: str) -> list[dict[str, Any]]:
    """ResourceSlice devices (``published_devices``) in CEL's view."""
    out = []
    for d in devices:
        attrs: dict[str, dict[str, object]] = {}
        for name, value in d["attributes"].items():
            domain, _, ident = name.rpartition("/")
            attrs.setdefault(domain or driver, {})[ident] = next(iter(value.values()))
        out.append({"driver": driver, "name": d["name"], "attributes": attrs})
    return out


def published_view(root: Path, config: Config, driver: str) -> list[dict[str, Any]]:
    """What the DRA plugin publishes on the sysfs tree at ``root`` under ``config``."""
    host = Host(root)
    inv = host.scan()
    devices = published_devices(inv, config, pcie_roots(host.fs, inv.devices))
    return cel_view([d.to_json() for d in devices], driver)


def selected(expressions: Sequence[str], devices: Sequence[dict[str, Any]]) -> set[str]:
    """Names of the devices every expression selects."""
    checks = [cel(e) for e in expressions]
    return {d["name"] for d in devices if all(c(d) for c in checks)}
