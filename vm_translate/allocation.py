"""Allocated addresses (``PCI_RESOURCE_*`` env, DRA claims) + entries → typed hostdevs (pure).

The device plugin hands the VM pod one env var per resource, named by
:func:`vfio_dp.model.naming.kubevirt_env_var`::

    PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_1EB8=0000:65:00.0,0000:66:00.0

Addresses are handed out IN ORDER, as KubeVirt's launcher does: entries are walked in spec
order (``hostDevices`` first, then ``gpus``; annotation entries in list order, ``count``
devices each) and the i-th device of a resource gets its i-th address. One pool per resource
is shared by both lists (KubeVirt keeps one pool per list, which would hand the same address
out twice when a resource appears in both). Missing variables or too few addresses are
errors naming the resource and the variable — never a silent skip.

DRA entries (:class:`~vm_translate.spec.ClaimEntry`) take the one address their claim's
request was given, read from the device-metadata file by :mod:`vm_translate.inputs` and passed
in as ``claims[(claim name, request name)]``; they get virt-launcher's ``ua-dra-*`` aliases and
need no env var. A spec may mix both kinds.

Mediated devices (vGPU-style slices) come the same ways with a UUID instead of an address: a
resource whose ``PCI_RESOURCE_*`` is unset and ``MDEV_PCI_RESOURCE_*`` is set (KubeVirt's
launcher reads them in that order), or a DRA device whose metadata carries ``mdevUUID`` (it
wins over ``pciBusID``). They become :class:`MdevSource` hostdevs, never multifunction.

With a :class:`Layout`, functions of one physical device (same domain:bus:slot, e.g. a GPU at
``.0`` and its audio function at ``.1``) are placed as functions of one guest slot, function
0 carrying ``multifunction='on'``, so guest drivers see the host's layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from vfio_dp.errors import AddressError
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.mdev import is_uuid
from vm_translate.entries import ClaimEntry, Entry
from vm_translate.errors import HostdevError

MAX_SLOT = 0x1F


@dataclass(frozen=True, slots=True)
class GuestAddress:
    """Where the device appears in the guest: ``<address type='pci' .../>`` in the hostdev."""

    bus: int
    slot: int
    function: int
    multifunction: bool = False
    domain: int = 0


@dataclass(frozen=True, slots=True)
class MdevSource:
    """A mediated device, by its UUID: ``<hostdev type='mdev'>…<address uuid='…'/>``."""

    uuid: str

    def __str__(self) -> str:
        return f"mdev {self.uuid}"


#: where a hostdev's device is on the host
Source = PciAddress | MdevSource


@dataclass(frozen=True, slots=True)
class Hostdev:
    """One ``<hostdev mode='subsystem' type='pci' managed='no'>`` (or ``type='mdev'``) to emit."""

    alias: str
    resource: str
    source: Source
    guest: GuestAddress | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """Multifunction placement: guest ``bus``, first guest ``slot`` to try, slots taken."""

    bus: int = 0
    first_slot: int = 0x10
    used_slots: frozenset[int] = frozenset()


def addresses_from_env(resource: str, env: Mapping[str, str]) -> list[Source]:
    """The devices the plugin allocated for ``resource``, in order: PCI addresses from
    ``PCI_RESOURCE_*``, else mdev UUIDs from ``MDEV_PCI_RESOURCE_*``."""
    var = naming.kubevirt_env_var(resource)
    mdev_var = naming.kubevirt_mdev_env_var(resource)
    value = env.get(var)
    if value is None and env.get(mdev_var) is not None:
        return _uuids(mdev_var, env[mdev_var])
    if value is None:
        raise HostdevError(
            f"no addresses for {resource}: environment variable {var} is not set (nor "
            f"{mdev_var}, for mediated devices); the device "
            f"plugin sets it when the pod's container has {resource} in resources.limits — "
            "request it there (or run where the variable is set)"
        )
    out: list[Source] = []
    for part in value.split(","):
        text = part.strip()
        if not text:
            continue
        try:
            addr = PciAddress.parse(text)
        except AddressError as e:
            raise HostdevError(f"{var}={value!r}: {e}") from e
        if addr in out:
            raise HostdevError(
                f"{var}={value!r} lists {addr} twice; each device can go to one VM slot"
            )
        out.append(addr)
    return out


def _uuids(var: str, value: str) -> list[Source]:
    out: list[Source] = []
    for part in value.split(","):
        text = part.strip()
        if not text:
            continue
        if not is_uuid(text):
            raise HostdevError(
                f"{var}={value[:200]!r}: {text[:64]!r} is not an mdev UUID (lowercase "
                "8-4-4-4-12 hex, as /sys/bus/mdev/devices names them)"
            )
        if MdevSource(text) in out:
            raise HostdevError(f"{var} lists {text} twice; each device can go to one VM slot")
        out.append(MdevSource(text))
    return out


def assign(
    entries: Sequence[Entry],
    env: Mapping[str, str],
    claims: Mapping[tuple[str, str], Source] | None = None,
) -> list[Hostdev]:
    """Map entries to allocated addresses: device-plugin entries positionally from the env
    (see module docstring), DRA entries from ``claims``."""
    pools: dict[str, list[Source]] = {}
    wanted: dict[str, list[str]] = {}
    for e in entries:
        if not isinstance(e, ClaimEntry):
            wanted.setdefault(e.resource, []).extend(e.aliases())
    for resource, aliases in wanted.items():
        pool = addresses_from_env(resource, env)
        if len(pool) < len(aliases):
            var = naming.kubevirt_env_var(resource)
            raise HostdevError(
                f"{resource}: {len(aliases)} devices wanted ({', '.join(aliases)}) but {var} "
                f"lists only {len(pool)} ({', '.join(map(str, pool)) or 'none'}); request "
                f"{len(aliases)} of {resource} in the pod's resources.limits"
            )
        pools[resource] = pool
    out: list[Hostdev] = []
    taken: dict[str, int] = {}
    for e in entries:
        if isinstance(e, ClaimEntry):
            out.append(_claim_hostdev(e, claims or {}))
            continue
        for alias in e.aliases():
            i = taken.get(e.resource, 0)
            taken[e.resource] = i + 1
            out.append(Hostdev(alias=alias, resource=e.resource, source=pools[e.resource][i]))
    _refuse_twice(out)
    return out


def _claim_hostdev(e: ClaimEntry, claims: Mapping[tuple[str, str], Source]) -> Hostdev:
    what = f"claim {e.claim_name}, request {e.request_name}"
    addr = claims.get((e.claim_name, e.request_name))
    if addr is None:
        raise HostdevError(
            f"entry {e.name!r} ({what}): no device address was read for it; point "
            "--dra-metadata-dir at the pod's device-metadata directory"
        )
    return Hostdev(alias=e.aliases()[0], resource=what, source=addr)


def _refuse_twice(hostdevs: Sequence[Hostdev]) -> None:
    """One host function can go to one guest slot: a DRA claim and an env var (or two claims)
    naming the same address is an error, not two hostdevs libvirt would refuse later."""
    seen: dict[Source, str] = {}
    for h in hostdevs:
        if h.source in seen:
            raise HostdevError(
                f"{h.source} is given to both {seen[h.source]} and {h.alias}; one host device "
                "can go to one VM slot: check the claims and resources requested"
            )
        seen[h.source] = h.alias


def place_multifunction(hostdevs: Iterable[Hostdev], layout: Layout) -> list[Hostdev]:
    """Give functions of one physical device one guest slot; singles are left to libvirt.

    Host functions keep their numbers when function 0 is among them (GPU ``.0`` + audio
    ``.1`` → guest ``.0`` + ``.1``); otherwise they are renumbered from 0 in host order,
    because a guest only scans a slot whose function 0 exists.
    """
    devs = list(hostdevs)
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, h in enumerate(devs):
        if isinstance(h.source, PciAddress):  # an mdev has no functions to keep together
            groups.setdefault(h.source.physical, []).append(i)
    slot = layout.first_slot
    for members in groups.values():
        if len(members) < 2:
            continue
        while slot in layout.used_slots:
            slot += 1
        if slot > MAX_SLOT:
            raise HostdevError(
                f"no free guest slot on bus 0x{layout.bus:02x} from 0x{layout.first_slot:02x} "
                "to 0x1f for a multifunction device; pick another --guest-bus or --guest-slot"
            )
        pci = {i: devs[i].source for i in members}
        ordered = sorted(members, key=lambda i: _function(pci[i]))
        keep = _function(pci[ordered[0]]) == 0
        for n, i in enumerate(ordered):
            fn = _function(pci[i]) if keep else n
            guest = GuestAddress(bus=layout.bus, slot=slot, function=fn, multifunction=fn == 0)
            devs[i] = replace(devs[i], guest=guest)
        slot += 1
    return devs


def _function(source: Source) -> int:
    assert isinstance(source, PciAddress)  # place_multifunction groups PCI sources only
    return source.function
