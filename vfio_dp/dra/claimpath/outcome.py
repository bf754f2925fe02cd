"""One claim's outcome from what its work raised: the error kubelet gets, and its kind.

Every place that answers for a claim -- Prepare and Unprepare
(:mod:`vfio_dp.dra.claimpath.prepare`), reconcile's release
(:mod:`vfio_dp.dra.claimpath.reconcile`) and the kubelet shell when the handler itself raised
(:mod:`vfio_dp.dra.kubeletapi.server`) -- maps the exception here and nowhere else::

    ClaimError                 refused   "claim default/vm (uid 1f..): device pci-...: <why; fix>"
    Held (a ClaimError)        held      "claim default/vm (uid 1f..): IOMMU group 45 is held open ..."
    another VfioError          refused   "claim default/vm (uid 1f..): <the error>"
    OSError (a state file)     io        "claim default/vm (uid 1f..): writing <path> failed: <why>; <fix>"
    anything else              internal  "claim default/vm (uid 1f..): internal error (<type>: <text>);
                                          ... please report it with the plugin's log"

An ``internal`` outcome is a bug: it is logged with its traceback (:meth:`Outcome.log`), the
others as one line. The text always names the claim; it never carries a traceback.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from vfio_dp.dra.claimpath.edits import io_error
from vfio_dp.errors import ClaimError, VfioError

REFUSED = "refused"
HELD = "held"
IO = "io"
INTERNAL = "internal"


class Held(ClaimError):
    """Devices a claim bound could not be given back yet (held open, or a failed restore)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a claim's failure means: ``kind`` (:data:`REFUSED`, :data:`HELD`, :data:`IO`,
    :data:`INTERNAL`) and ``error``, the text kubelet gets (it names the claim)."""

    kind: str
    error: str
    cause: BaseException

    def log(self, log: logging.Logger, what: str) -> None:
        """One line for an expected failure; the traceback for an internal one."""
        if self.kind == INTERNAL:
            log.error("%s: %s", what, self.error, exc_info=self.cause)
        else:
            log.warning("%s: %s", what, self.error)


def _io(e: OSError, fallback: str | None) -> VfioError:
    """An OSError that escaped the writers that name their paths: its own (absolute) file
    name, else ``fallback`` (the checkpoint: the one other file of the claim path)."""
    name = e.filename if isinstance(e.filename, str) and os.path.isabs(e.filename) else None
    return io_error("writing", name or fallback or "a state file", e)


def outcome(who: str, e: BaseException, state_file: str | None = None) -> Outcome:
    """The outcome of claim ``who`` (:func:`vfio_dp.dra.claimpath.claims.describe`) whose
    work raised ``e``; ``state_file`` names the file an unnamed :class:`OSError` was about."""
    if isinstance(e, Held):
        return Outcome(HELD, str(e), e)
    if isinstance(e, ClaimError):
        return Outcome(REFUSED, str(e), e)
    if isinstance(e, VfioError):
        return Outcome(REFUSED, str(ClaimError(who, str(e))), e)
    if isinstance(e, OSError):
        return Outcome(IO, str(ClaimError(who, str(_io(e, state_file)))), e)
    reason = (
        f"internal error ({type(e).__name__}: {str(e)[:200]}); the other claims of the "
        "request are not affected -- please report it with the plugin's log"
    )
    return Outcome(INTERNAL, str(ClaimError(who, reason)), e)
