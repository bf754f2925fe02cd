"""A DRA handler with real in-memory semantics for front-end tests (prepare is idempotent,
unprepare forgets), plus knobs to misbehave: omit a claim, raise, be slow."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from tests.dra.conftest import DRIVER, NODE
from vfio_dp.dra.claimpath.claims import ClaimRef, ClaimResult, PreparedDevice

UID_A = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
UID_B = "11111111-2222-3333-4444-555555555555"


class RecordingHandler:
    """A handler with real (in-memory) semantics: prepare is idempotent, unprepare forgets."""

    def __init__(self) -> None:
        self.prepared: dict[str, ClaimRef] = {}
        self.calls: list[tuple[str, list[str]]] = []
        self.omit: set[str] = set()
        self.fail_with: Exception | None = None
        self.delay = 0.0
        #: when set, prepare waits until the test opens it (a bind that ends when the test says)
        self.gate: asyncio.Event | None = None
        self.finished: list[str] = []

    def device(self, claim: ClaimRef) -> PreparedDevice:
        return PreparedDevice(
            request_names=("gpu",),
            pool_name=NODE,
            device_name="pci-0000-3b-00-0",
            cdi_device_ids=(f"{DRIVER}/pci=g{claim.uid[:8]}",),
        )

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, ClaimResult]:
        self.calls.append(("prepare", [c.uid for c in claims]))
        if self.delay:  # the scenario: a slow handler (a bind that takes this long)
            await asyncio.sleep(self.delay)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        out = {}
        for c in claims:
            if c.uid in self.omit:
                continue
            self.prepared[c.uid] = c
            out[c.uid] = ClaimResult(devices=(self.device(c),))
        self.finished.append("prepare")
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.calls.append(("unprepare", [c.uid for c in claims]))
        if self.fail_with is not None:
            raise self.fail_with
        out = {}
        for c in claims:
            if c.uid in self.omit:
                continue
            self.prepared.pop(c.uid, None)
            out[c.uid] = ""
        return out
