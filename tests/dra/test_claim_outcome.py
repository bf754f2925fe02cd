"""One claim-outcome mapper (issue 33 item 7): an exception raised for a claim means the same
text and kind wherever it is caught -- Prepare, Unprepare, reconcile, and the kubelet shell
when the handler itself raised. The shell and the claim path are driven for real (the kubelet
DRA stand-in over unix sockets; the preparer on a temp tree with the kernel simulator)."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.dra.conftest import DRIVER, NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.recording_handler import UID_A, RecordingHandler
from tests.dra.test_prepare import Claims, _boot, result
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath.claims import describe
from vfio_dp.dra.claimpath.outcome import HELD, INTERNAL, IO, REFUSED, Held, outcome
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.dra.kubeletapi.server import KubeletFrontEnd
from vfio_dp.errors import ClaimError, HostError
from vfio_dp.host import Host
from vfio_dp.model.config import Config

WHO = describe("default", "a", UID_A)


def test_each_failure_has_one_kind_and_a_text_naming_the_claim() -> None:
    refused = outcome(WHO, ClaimError(WHO, "opaque config; remove it", "pci-0000-3b-00-0"))
    assert refused.kind == REFUSED
    assert refused.error == f"claim {WHO}: device pci-0000-3b-00-0: opaque config; remove it"
    host = outcome(WHO, HostError("0000:3b:00.0 is gone from the host"))
    assert (host.kind, host.error) == (REFUSED, f"claim {WHO}: 0000:3b:00.0 is gone from the host")
    held = outcome(WHO, Held(WHO, "IOMMU group 45 is held open by qemu (pid 7)"))
    assert (held.kind, held.error) == (
        HELD,
        f"claim {WHO}: IOMMU group 45 is held open by qemu (pid 7)",
    )
    full = outcome(WHO, OSError(errno.ENOSPC, "No space left on device"), "/var/lib/x.json")
    assert full.kind == IO
    assert full.error == (
        f"claim {WHO}: writing /var/lib/x.json failed: No space left on device; "
        "free space on the filesystem that holds it"
    )
    bug = outcome(WHO, KeyError("pool"))
    assert bug.kind == INTERNAL and bug.error.startswith(f"claim {WHO}: internal error (KeyError")
    assert "Traceback" not in bug.error


@pytest.fixture
def handler() -> RecordingHandler:
    return RecordingHandler()


@pytest.fixture
async def kubelet(
    kdirs: tuple[str, str], handler: RecordingHandler
) -> AsyncIterator[KubeletDraStandin]:
    registry, plugins = kdirs
    front = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    await front.start()
    k = KubeletDraStandin(registry, NODE, poll=0.02)
    await k.start()
    await k.wait_for("registration", lambda k: k.usable(DRIVER))
    yield k
    await k.stop()
    await front.stop()


async def test_a_handler_that_raises_a_claim_error_answers_with_that_claims_own_text(
    kubelet: KubeletDraStandin, handler: RecordingHandler
) -> None:
    """The shell adds the driver's name and nothing else: kubelet reads the claim path's
    error, not ``preparing ... failed: ClaimError: claim ...`` around it."""
    handler.fail_with = ClaimError(WHO, "the IOMMU group is not viable; bind its siblings")
    answer = await kubelet.prepare(DRIVER, [("default", UID_A, "a")])
    assert answer[UID_A].error == f"driver {DRIVER}: {outcome(WHO, handler.fail_with).error}"
    errors = await kubelet.unprepare(DRIVER, [("default", UID_A, "a")])
    assert errors[UID_A] == answer[UID_A].error


async def test_the_shell_and_the_claim_path_say_the_same_of_the_same_failure(
    kubelet: KubeletDraStandin,
    handler: RecordingHandler,
    tree: SysfsTree,
    kernel: SimulatedKernel,
    tmp_path: Path,
) -> None:
    """A bug raised inside Prepare (here: the config cannot be had) and the same bug raised by
    the handler as a whole reach kubelet as the same text."""
    _boot(tree, "boot-1")
    claims = Claims()
    ref = claims.add("a", UID_A, [result("pci-0000-3b-00-0", request="gpu")])
    bug = RuntimeError("the config went away")

    def config() -> Config:
        raise bug

    prep = ClaimPreparer(
        host=Host(tree.root, kernel=kernel), driver=DRIVER, node=NODE,
        cdi_dir=str(tmp_path / "cdi"), plugins_dir=str(tmp_path / "plugins"),
        read_claim=claims.read, config=config,
    )  # fmt: skip
    inside = (await prep.prepare([ref]))[UID_A].error
    assert inside == outcome(WHO, bug).error
    handler.fail_with = bug
    answer = await kubelet.prepare(DRIVER, [("default", UID_A, "a")])
    assert answer[UID_A].error == f"driver {DRIVER}: {inside}"
