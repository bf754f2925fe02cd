"""Shared fixtures: real temp sysfs trees (tests/sysfs_tree.py) and the kernel simulator;
the per-test time limits of the slow kinds of test.

Every test has a time limit (pytest-timeout, ``timeout`` in pyproject.toml: 120 s). A test
marked ``guest`` (one QEMU boot under TCG runs its scripts: up to 1500 s for the crash and DRA
scenarios, plus the boot) or ``image`` (mmdebstrap, import and a buildah build: minutes) gets a larger one, unless it names its own with ``@pytest.mark.timeout(...)``.
"""

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


#: Seconds for one guest test (its module's boot included): above the rig's own limit for the
#: longest run (a 1500 s script: 120 s boot + 1500 + 15 + 60 = 1695 s) plus building the
#: kernel's initramfs, so the rig's own error (with the guest's console) comes first.
GUEST_TIMEOUT = 2400
#: Seconds for one image test: a build takes minutes (the Debian base is cached after the
#: first); an hour leaves room for a cold cache and stays inside CI's 90 minutes.
IMAGE_TIMEOUT = 3600


@pytest.hookimpl(trylast=True)  # after tests/guest/conftest.py has marked its tests `guest`
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        if item.get_closest_marker("image") is not None:
            item.add_marker(pytest.mark.timeout(IMAGE_TIMEOUT))
        elif item.get_closest_marker("guest") is not None:
            item.add_marker(pytest.mark.timeout(GUEST_TIMEOUT))
