"""The typed passthrough entries and the resource name a device name stands for (pure).

An entry is what a VM spec author asks for, resolved: a :class:`DeviceEntry` (a resource
name, from ``deviceName`` or the Pod annotation) or a :class:`ClaimEntry` (a DRA claim's
request). :mod:`vm_translate.spec` reads them out of the objects.

A ``vendor:device`` pair becomes a resource name through the daemon's own configuration
(:meth:`vfio_dp.model.config.Config.resources_for_ids`), so custom names and domains agree;
a pair with several candidates is rejected naming them. Names in the configured domain must
be names the configuration can advertise (a case slip is corrected to the canonical name);
names of other domains (``nvidia.com/...``) pass untouched::

    10DE:1eb8                        -> devices.kubevirt.io/10de_1eb8 (or the configured name)
    devices.kubevirt.io/10DE_1EB8    -> devices.kubevirt.io/10de_1eb8
    nvidia.com/TU104GL_Tesla_T4      -> nvidia.com/TU104GL_Tesla_T4

Mediated devices (the config's ``mdev:`` entries with ``path: devicePlugin``) are named like
any resource: an entry's ``resourceName`` is a known name. An entry without one is advertised
under the default made from its type's ``name`` file on the node
(:func:`vfio_dp.model.naming.default_mdev_resource_name`), which the webhook cannot read: while
such an entry exists, any well-formed name in the configured domain is let through, and so is
the type's name as KubeVirt's ``mdevNameSelector`` spells it (``GRID T4-1Q`` ->
``devices.kubevirt.io/GRID_T4-1Q``); the node check (``--check-nodes``) then refuses a name no
node advertises. Give such entries a ``resourceName`` to have every name checked here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from vfio_dp.model import naming
from vfio_dp.model.config import DEVICE_PLUGIN, Config
from vm_translate.alias import Kind, alias_for, dra_alias_for
from vm_translate.errors import Problem, Unresolvable

_PAIR = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{4})")
_DEFAULT_SHORT = re.compile(r"([0-9a-fA-F]{4})_([0-9a-fA-F]{4})")


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """One requested passthrough entry, its resource name resolved.

    ``count`` > 1 only comes from the Pod annotation; KubeVirt lists one entry per device.
    """

    name: str
    resource: str
    kind: Kind = "hostdevice"
    count: int = 1

    def aliases(self) -> list[str]:
        """``ua-<kind>-<name>``, or ``ua-<kind>-<name>-<i>`` (i = 0..count-1) when count > 1."""
        if self.count == 1:
            return [alias_for(self.kind, self.name)]
        return [alias_for(self.kind, self.name, i) for i in range(self.count)]


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    """One DRA entry (``claimName``/``requestName``): one device of a claim's request.

    ``claim_name`` is the VMI-level claim name (an entry of ``spec.resourceClaims``), not the
    ResourceClaim object's name; :mod:`vm_translate.dra` resolves it to the metadata path.
    """

    name: str
    claim_name: str
    request_name: str
    kind: Kind = "hostdevice"

    def aliases(self) -> list[str]:
        """``ua-dra-<kind>-<name>``, as virt-launcher names DRA host devices and GPUs."""
        return [dra_alias_for(self.kind, self.name)]


#: Any resolved entry of a VM spec or annotation.
Entry = DeviceEntry | ClaimEntry


@dataclass(frozen=True, slots=True)
class VmClaim:
    """One ``spec.resourceClaims[]`` entry of a VMI: a claim by name or from a template."""

    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


#: :func:`resolve_device_name`'s answers under one configuration (a resource name, or why
#: not): reviews name the same few devices again and again. Emptied when the configuration
#: object changes (a reload) and when it holds :data:`RESOLVED_MAX` names (they come from
#: clients).
_resolved: tuple[Config | None, dict[str, str | Unresolvable]] = (None, {})
RESOLVED_MAX = 512


def resolve_device_name(value: object, config: Config) -> str:
    """The resource name a ``deviceName`` / ``resource`` value stands for.

    ``10DE:1eb8`` → ``devices.kubevirt.io/10de_1eb8`` (or the configured custom name);
    ``devices.kubevirt.io/10DE_1EB8`` → ``devices.kubevirt.io/10de_1eb8``;
    ``nvidia.com/TU104GL_Tesla_T4`` → unchanged. Raises :class:`Unresolvable`.
    """
    global _resolved
    if not isinstance(value, str):
        return _resolve(value, config)
    known, answers = _resolved
    if known is not config or len(answers) >= RESOLVED_MAX:
        answers = {}
        _resolved = (config, answers)
    answer = answers.get(value)
    if answer is None:
        try:
            answer = _resolve(value, config)
        except Unresolvable as why:
            answer = why
        answers[value] = answer
    if isinstance(answer, Unresolvable):
        raise Unresolvable(str(answer))
    return answer


def _resolve(value: object, config: Config) -> str:
    domain = config.resource_domain
    example = f"a resource name like {domain}/10de_1eb8 or a vendor:device pair like 10de:1eb8"
    if not isinstance(value, str) or not value:
        raise Unresolvable(f"must be {example}")
    if ":" in value:
        m = _PAIR.fullmatch(value)
        if not m:
            raise Unresolvable(
                "is not a vendor:device pair: each ID is exactly 4 hex digits, e.g. 10de:1eb8 "
                "(see `lspci -nn`)"
            )
        return resolve_ids(m.group(1), m.group(2), config)
    if "/" not in value:
        qualified = naming.qualify(value, domain)
        canonical = _known_name(qualified, config)
        if canonical is None and _default_named_mdev(config):
            canonical = naming.default_mdev_resource_name(value, value, domain)
        if canonical is None:
            raise Unresolvable(f"is neither {example}; resource names carry a domain")
        return canonical
    why = naming.resource_name_problem(value)
    if why:
        raise Unresolvable(f"is not a valid resource name: {why}")
    if value.partition("/")[0] != domain:
        return value  # another provider's resource (nvidia.com/...): not ours to judge
    canonical = _known_name(value, config)
    if canonical is None and _default_named_mdev(config):
        return value  # maybe a type's default name: the node check judges it
    if canonical is None:
        known = ", ".join(config.resource_names) or "none by explicit name"
        raise Unresolvable(
            f"unknown resource: the vfio_dp configuration advertises {known}, plus "
            f"{domain}/<vendor>_<device> for devices it selects by ID; fix the name, use "
            "vendor:device, or add a selector to the ConfigMap"
        )
    return canonical


def resolve_ids(vendor: str, device: str, config: Config) -> str:
    """The one resource name the configuration advertises ``vendor:device`` under, else
    :class:`Unresolvable` (none, or several: they are named)."""
    pair = f"{vendor.lower()}:{device.lower()}"
    candidates = config.resources_for_ids(vendor, device)
    if not candidates:
        raise Unresolvable(
            f"no selector of the vfio_dp configuration takes {pair}, so no node advertises it; "
            "add a selector for it to the ConfigMap or name the resource directly"
        )
    if len(candidates) > 1:
        raise Unresolvable(
            f"{pair} is ambiguous: it may be advertised as any of {', '.join(candidates)}; "
            "name one of them instead of the pair"
        )
    return candidates[0]


def _default_named_mdev(config: Config) -> bool:
    """Does a device-plugin ``mdev:`` entry go by its type's default name (module docstring)?"""
    return any(e.path == DEVICE_PLUGIN and not e.resource_name for e in config.mdev)


def _known_name(name: str, config: Config) -> str | None:
    """The canonical spelling of ``name`` if the configuration can advertise it, else None."""
    folded = name.lower()
    for explicit in config.resource_names:
        if explicit.lower() == folded:
            return explicit
    domain, _, short = name.partition("/")
    m = _DEFAULT_SHORT.fullmatch(short)
    if m and domain == config.resource_domain:
        default = naming.default_resource_name(m.group(1), m.group(2), domain)
        if default in config.resources_for_ids(m.group(1), m.group(2)):
            return default
    return None


def alias_conflicts(entries: Sequence[Entry], where: str) -> list[Problem]:
    """Entries whose (sanitized) aliases collide — libvirt refuses the same alias twice."""
    seen: dict[str, str] = {}
    problems: list[Problem] = []
    for e in entries:
        for alias in e.aliases():
            if alias in seen:
                problems.append(
                    Problem(
                        where,
                        e.name,
                        f"name gives libvirt alias {alias!r}, already used by entry "
                        f"{seen[alias]!r}; names must stay distinct once characters outside "
                        "[a-zA-Z0-9_-] become '-'; rename one",
                    )
                )
            else:
                seen[alias] = e.name
    return problems


#: upstream's ``DeviceRequestsMaxSize`` (resource.k8s.io/v1): a ResourceClaim (or a
#: template's claim) holds at most 32 requests; the API server refuses a longer list.
MAX_CLAIM_REQUESTS = 32


def claim_request_problem(claim: str, requests: int, where: str) -> Problem | None:
    """A claim asked for more requests than the API allows (:data:`MAX_CLAIM_REQUESTS`) —
    what ``translate --dra`` would generate and what the admission check sees in a VM whose
    DRA entries (one request each) name one claim."""
    if requests <= MAX_CLAIM_REQUESTS:
        return None
    return Problem(
        where,
        claim,
        f"{requests} DRA entries would each be a request of this one claim, but a "
        f"ResourceClaim holds at most {MAX_CLAIM_REQUESTS} requests (resource.k8s.io/v1): the API server refuses it "
        f"at creation; give the VM at most {MAX_CLAIM_REQUESTS} DRA devices per claim "
        "(split them across claims, or leave some on the device-plugin path)",
    )


def claim_request_limits(entries: Sequence[Entry], where: str) -> list[Problem]:
    """One problem per claim whose DRA entries exceed :data:`MAX_CLAIM_REQUESTS`."""
    counts: dict[str, int] = {}
    for e in entries:
        if isinstance(e, ClaimEntry):
            counts[e.claim_name] = counts.get(e.claim_name, 0) + 1
    found = (claim_request_problem(c, n, where) for c, n in counts.items())
    return [p for p in found if p is not None]
