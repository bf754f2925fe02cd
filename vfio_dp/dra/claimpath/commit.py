"""One durable checkpoint write per kubelet call: the claims of a NodePrepareResources or
NodeUnprepareResources arrive with their checkpoint change, the last one in starts the
write, and every claim is answered after it (with its error, if it failed).

The checkpoint file (``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json``,
:mod:`.checkpoint`) is rewritten whole and fsynced for a change: done once per claim, a call
of 1,000 claims was hundreds of such writes of a growing file (issue 39: 5.6 s for the
Prepare, 3.2 s for the Unprepare; goal < 3 s each). Done once per call it is one write, and
the answer still never comes before the checkpoint holds it: each claim's task waits for
the write holding its claim's lock, so a retry of the claim finds it on disk.

Every claim of the call arrives exactly once: :meth:`CallCommit.arrive` with a function that
stages its change (:meth:`~vfio_dp.dra.claimpath.checkpoint.Checkpoint.stage`,
``stage_remove``: returns the change's number, or None for no change), or
:meth:`CallCommit.leave` (it failed). When the last has arrived, one worker thread runs
``before`` (an Unprepare: the ``fsync`` of the CDI and metadata directories its claims'
files were removed from, so the files are gone on disk before the checkpoint forgets the
claims; if it fails, nothing is staged and every claim gets its error), stages every
change, commits the highest number (one write carries them all), then each number once
(:meth:`~vfio_dp.dra.claimpath.checkpoint.Checkpoint.commit`: a failed write fails each
change it carried).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from vfio_dp.dra.claimpath.checkpoint import Checkpoint

#: stages one claim's checkpoint change in memory: its number, None when nothing changed
Stage = Callable[[], "int | None"]


class CallCommit:
    """The durable write shared by the ``expected`` claims of one kubelet call."""

    def __init__(
        self, checkpoint: Checkpoint, expected: int, before: Callable[[], None] | None = None
    ) -> None:
        self.checkpoint = checkpoint
        self.before = before
        self._left = expected
        self._stages: list[Stage] = []
        self._done: asyncio.Future[dict[int, Exception]] | None = None
        self._task: asyncio.Task[None] | None = None

    def leave(self) -> None:
        """A claim of the call that has nothing to record (it failed, or was cancelled)."""
        self._arrived(None)

    async def arrive(self, stage: Stage) -> None:
        """A claim's change: return once it is on disk; raise the error that kept it off
        (the ``before`` step's or the write's). Call it (or :meth:`leave`) once per claim."""
        index = len(self._stages)
        done = self._arrived(stage)
        failures = await asyncio.shield(done)
        if index in failures:
            raise failures[index]

    def _arrived(self, stage: Stage | None) -> asyncio.Future[dict[int, Exception]]:
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        if stage is not None:
            self._stages.append(stage)
        self._left -= 1
        if self._left == 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write(self._done))
        return self._done

    async def _write(self, done: asyncio.Future[dict[int, Exception]]) -> None:
        try:
            failures = await asyncio.to_thread(self._commit_all, list(self._stages))
        except BaseException:  # cancelled at stop: so is every waiter
            done.cancel()
            raise
        if not done.done():
            done.set_result(failures)

    def _commit_all(self, stages: list[Stage]) -> dict[int, Exception]:
        """Blocking: ``before``, then stage each change, commit them; → the index of each
        arrival that failed → its error."""
        if self.before is not None:
            try:
                self.before()
            except Exception as e:
                return dict.fromkeys(range(len(stages)), e)
        gens = [stage() for stage in stages]
        failed: dict[int, Exception] = {}
        for gen in sorted({g for g in gens if g is not None}, reverse=True):
            try:
                self.checkpoint.commit(gen)
            except Exception as e:
                failed[gen] = e
        return {i: failed[g] for i, g in enumerate(gens) if g is not None and g in failed}
