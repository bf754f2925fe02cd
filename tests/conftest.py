"""Shared fixtures: real temp sysfs trees (tests/sysfs_tree.py) and the kernel simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree, gpu_host


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return gpu_host(tmp_path / "root")


@pytest.fixture
def kernel(tree: SysfsTree) -> SimulatedKernel:
    return SimulatedKernel(tree)
