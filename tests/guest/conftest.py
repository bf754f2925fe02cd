"""Fixtures for tests that run inside the QEMU guest rig (real kernel, emulated Intel IOMMU).

Every test under tests/guest is marked ``guest`` (deselect with ``-m "not guest"``).

If the rig cannot be had (no QEMU, no kernel, no busybox-static, ...) the tests FAIL with the
reason -- a broken install must not pass silently -- unless ``VFIO_DP_SKIP_GUEST=1`` is set, in
which case they are skipped with the reason.

Each boot costs ~10-20 s, so batch: ``guest.run_many({"a": script_a, "b": script_b})`` runs
several scripts in ONE boot; put it in a module-scoped fixture and let several tests assert on
its results (see test_rig_smoke.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from .rig import (
    DEFAULT_MODULES,
    DEFAULT_TOPOLOGY,
    GuestResult,
    GuestRig,
    GuestRigUnavailable,
    KernelAssets,
    Topology,
)

_HERE = Path(__file__).resolve().parent


class Guest:
    """Handle given to tests: each ``run``/``run_many`` call is one fresh boot of the guest."""

    def __init__(self, rig: GuestRig) -> None:
        self.rig = rig
        kernel, _initrd = rig.prepare()
        self.kernel: KernelAssets = kernel

    @property
    def topology(self) -> Topology:
        return self.rig.topology

    def run(
        self, script: str, *, timeout: float = 300, env: Mapping[str, str] | None = None
    ) -> GuestResult:
        """Boot, run ``script`` (bash, cwd = checkout root) as root in the guest, power off."""
        return self.rig.run(script, timeout=timeout, env=env)

    def run_many(
        self,
        scripts: Mapping[str, str],
        *,
        timeout: float = 300,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, GuestResult]:
        """Boot once, run each script in order (``timeout`` per script), one result per name."""
        return self.rig.run_many(scripts, timeout=timeout, env=env)

    def with_options(
        self,
        *,
        topology: Topology | None = None,
        modules: Sequence[str] | None = None,
        extra_qemu_args: Sequence[str] = (),
    ) -> Guest:
        """A guest with another PCI topology, another set of preloaded modules, or extra
        QEMU devices (e.g. the SR-IOV NVMe controller of test_sriov_real_kernel.py)."""
        return Guest(
            GuestRig(
                topology=topology or self.rig.topology,
                modules=tuple(modules) if modules is not None else self.rig.modules,
                kernel_version=self.kernel.version,
                extra_qemu_args=tuple(extra_qemu_args),
            )
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "guest: runs inside a QEMU guest with a real kernel and an emulated IOMMU (slow)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.guest)


@pytest.fixture(scope="session")
def guest() -> Guest:
    """A ready guest rig (kernel + initramfs cached); fails or skips if unavailable."""
    try:
        return Guest(GuestRig(topology=DEFAULT_TOPOLOGY, modules=DEFAULT_MODULES))
    except GuestRigUnavailable as exc:
        if os.environ.get("VFIO_DP_SKIP_GUEST") == "1":
            pytest.skip(f"guest rig unavailable (VFIO_DP_SKIP_GUEST=1): {exc}")
        pytest.fail(
            f"guest rig unavailable: {exc}\n"
            "Install qemu-system-x86, busybox-static, kmod and cpio, or set "
            "VFIO_DP_SKIP_GUEST=1 to skip the guest tests explicitly.",
            pytrace=False,
        )
