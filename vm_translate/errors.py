"""The one exception tree of ``vm_translate``, rooted at :class:`TranslateError`.

Every error carries the data it is about and a message that names the value and the fix::

    pod default/launcher: invalid passthrough request:
      metadata.annotations[devices.kubevirt.io/passthrough][1] (name 'gpu'): count 0: count must
      be a whole number >= 1; remove the entry or set count: 1

``exit_code`` is what ``vfioctl`` exits with: 2 for mistakes in what the user typed
(:class:`TranslateUsageError`), 1 for everything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class TranslateError(Exception):
    """Base of every error raised by vm_translate."""

    exit_code: int = 1


class TranslateUsageError(TranslateError):
    """The command line or an input file is unusable (unreadable, not YAML). Exit code 2."""

    exit_code = 2


class PortError(TranslateUsageError):
    """The webhook's --host/--port cannot be listened on (busy, or not ours to bind)."""


class InputError(TranslateUsageError):
    """An input file or option value cannot be read or decoded."""

    def __init__(self, source: str, why: str) -> None:
        self.source = source
        self.why = why
        super().__init__(f"{source}: {why}")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one entry of a spec: where, the offending value, why + the fix."""

    where: str
    value: object
    why: str

    def __str__(self) -> str:
        value = repr(self.value)
        if len(value) > MAX_VALUE_SHOWN:
            value = value[:MAX_VALUE_SHOWN] + f"... ({len(value)} characters)"
        return f"{self.where}: {value}: {self.why}"


#: how many problems a message lists (the rest are counted), and how much of each value
MAX_PROBLEMS_SHOWN = 20
MAX_VALUE_SHOWN = 200


class SpecError(TranslateError):
    """A VM / Pod spec asks for passthrough devices wrongly; ``problems`` lists EVERY problem,
    its message the first :data:`MAX_PROBLEMS_SHOWN` and how many more (a denial stays short
    whatever the spec holds)."""

    def __init__(self, subject: str, problems: Sequence[Problem]) -> None:
        self.subject = subject
        self.problems = tuple(problems)
        lines = [f"  {p}" for p in self.problems[:MAX_PROBLEMS_SHOWN]]
        more = len(self.problems) - MAX_PROBLEMS_SHOWN
        if more > 0:
            lines.append(f"  ... and {more} more problem(s) of the same spec")
        super().__init__(f"{subject}: invalid passthrough request:\n" + "\n".join(lines))


class Unresolvable(TranslateError, ValueError):
    """A device name cannot be resolved to a resource name; the message says why and the fix
    (collected into a :class:`SpecError` :class:`Problem` by the spec readers)."""


class PatchError(TranslateError, ValueError):
    """A JSONPatch does not apply to the document."""


class ReviewError(TranslateError):
    """A webhook request body is not a valid AdmissionReview (the webhook answers HTTP 400)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"not an admission.k8s.io/v1 AdmissionReview: {reason}")


class HostdevError(TranslateError):
    """Allocated addresses cannot be turned into hostdevs (missing env var, too few addresses)."""


class DomainXmlError(TranslateError):
    """A libvirt domain definition cannot be parsed or merged."""


class LibvirtError(TranslateError):
    """libvirt refused a connection, a definition or an attach."""


class TlsError(TranslateUsageError):
    """The webhook's certificate or key cannot be loaded or generated (exit 2)."""


class CertificateJobError(TranslateError):
    """``vfioctl webhook-certs`` could not read or write the cluster's objects (exit 1): the
    API server refused, answered too slowly, or answered something that is not the object."""


class ApiUnreachableError(CertificateJobError):
    """``vfioctl webhook-certs`` could not reach the API server at all (exit 2: the
    kubeconfig or the network is wrong, not the cluster's objects)."""

    exit_code = 2


class NodeCheckError(TranslateError):
    """The node-capacity check could not ask the API server."""


class FleetError(TranslateUsageError, ValueError):
    """``kubectl vfio``: a command it will not run on the nodes, or an output it cannot merge."""


class ClusterError(TranslateError):
    """``kubectl vfio``: the API server cannot be reached or refused; names the server and why."""
