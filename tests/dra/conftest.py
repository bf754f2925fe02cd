"""Fixtures for the DRA tests: the API-server stand-in, short kubelet dirs (unix socket paths
are limited to 107 bytes) and a valid ResourceSlice to start cases from."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import NODES, ApiServerStandin

DRIVER = "vfio.example.com"
NODE = "node-a"


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerStandin]:
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    yield api
    api.stop()


@pytest.fixture
def kdirs() -> Iterator[tuple[str, str]]:
    """(registry dir, plugins dir), short enough for unix socket paths; both exist, as the
    kubelet makes them when it starts (the plugin refuses a missing one)."""
    d = tempfile.mkdtemp(prefix="kdra", dir="/tmp")
    for sub in ("plugins_registry", "plugins"):
        os.mkdir(f"{d}/{sub}")
    yield f"{d}/plugins_registry", f"{d}/plugins"
    shutil.rmtree(d, ignore_errors=True)


def a_slice(
    name: str = "node-a-vfio-example-com-0",
    *,
    node: str = NODE,
    driver: str = DRIVER,
    generation: int = 1,
    devices: int = 1,
) -> dict[str, Any]:
    """A ResourceSlice the real API server accepts (as the DRA plugin publishes them)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"app": "vfio-dp"}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"pci-0000-3b-{i:02x}-0",
                    "attributes": {
                        "resource.kubernetes.io/pciBusID": {"string": f"0000:3b:{i:02x}.0"},
                        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
                        "vendorID": {"string": "10de"},
                        f"{driver}/iommuGroup": {"int": 40 + i},
                        f"{driver}/numaNode": {"int": 0},
                    },
                }
                for i in range(devices)
            ],
        },
    }
