"""Define or attach hostdevs through libvirt-python (the one module that imports libvirt).

- :func:`define`: merge the hostdevs into a domain definition — a given XML document, or the
  persistent (inactive) XML of the named domain — and ``virConnect.defineXML`` it. Same-alias
  hostdevs are replaced, so defining twice leaves the same domain.
- :func:`attach`: hot-plug into a running domain with ``virDomain.attachDeviceFlags``
  (``AFFECT_LIVE``, plus ``AFFECT_CONFIG`` when the domain is persistent); devices whose
  alias the live domain already has are skipped.
- :func:`define_or_attach`: the choice between the two that ``vfioctl hostdev --connect``
  makes, and which domain XML the hostdevs are placed against.

``uri`` is any libvirt URI: ``qemu:///system`` in a launcher, ``test:///default`` in tests
(libvirt's real XML parser, no daemon; it does not implement attach).

libvirt-python is the optional extra ``vfio-dp[libvirt]`` (it builds from source, with a C
compiler and libvirt's headers): importing this module without it raises
:class:`~vm_translate.errors.TranslateUsageError` saying how to install it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vm_translate import hostdev
from vm_translate.allocation import Hostdev
from vm_translate.errors import LibvirtError, TranslateUsageError

try:
    import libvirt
except ImportError as e:  # the optional extra is not installed
    raise TranslateUsageError(
        "--connect needs libvirt-python, which is not installed: pip install 'vfio-dp[libvirt]' (pipx: pipx inject "
        "vfio-dp libvirt-python); it builds with gcc, pkg-config, libvirt-dev and python3-dev"
    ) from e


@dataclass(frozen=True, slots=True)
class Outcome:
    """What was done: ``action`` is ``defined`` or ``attached``; ``aliases`` the devices."""

    domain: str
    action: str
    aliases: tuple[str, ...]


def _quiet(_ctx: object, _err: object) -> None:
    """libvirt prints every error on stderr by default; ours are raised instead."""


def open_connection(uri: str) -> libvirt.virConnect:
    libvirt.registerErrorHandler(_quiet, None)
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise LibvirtError(
            f"cannot connect to libvirt at {uri}: {e.get_error_message()}; check --connect "
            "and that libvirtd/virtqemud runs and its socket is reachable"
        ) from e


def define_xml(conn: libvirt.virConnect, xml: str, what: str) -> libvirt.virDomain:
    try:
        return conn.defineXML(xml)
    except libvirt.libvirtError as e:
        raise LibvirtError(
            f"libvirt refused the definition of {what}: {e.get_error_message()}"
        ) from e


def define(
    uri: str,
    hostdevs: Sequence[Hostdev],
    *,
    domain_xml: str | None = None,
    domain_name: str | None = None,
) -> tuple[Outcome, str]:
    """Merge ``hostdevs`` into ``domain_xml`` (or the named domain's persistent XML) and define
    it; return the outcome and the XML that was defined."""
    conn = open_connection(uri)
    try:
        if domain_xml is None:
            if domain_name is None:
                raise LibvirtError("define needs a domain XML document or a domain name")
            dom = _lookup(conn, domain_name, uri)
            domain_xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        merged = hostdev.merge(domain_xml, hostdevs)
        dom = define_xml(conn, merged, domain_name or "the domain")
        return Outcome(dom.name(), "defined", tuple(h.alias for h in hostdevs)), merged
    finally:
        conn.close()


def persistent_xml(uri: str, domain_name: str) -> str:
    """The named domain's persistent (inactive) definition."""
    conn = open_connection(uri)
    try:
        return str(_lookup(conn, domain_name, uri).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    finally:
        conn.close()


def attach(uri: str, domain_name: str, hostdevs: Sequence[Hostdev]) -> Outcome:
    """Hot-plug ``hostdevs`` into the running domain ``domain_name`` (see module docstring)."""
    conn = open_connection(uri)
    try:
        dom = _lookup(conn, domain_name, uri)
        if not dom.isActive():
            raise LibvirtError(
                f"domain {domain_name} is not running; define instead (omit --live) or start it"
            )
        live = hostdev.parse_domain(dom.XMLDesc(0), domain_name)
        present = {a.get("name") for a in live.iterfind("devices/hostdev/alias")}
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE
        if dom.isPersistent():
            flags |= libvirt.VIR_DOMAIN_AFFECT_CONFIG
        done: list[str] = []
        for h in hostdevs:
            if h.alias in present:
                continue
            try:
                dom.attachDeviceFlags(hostdev.render([h]), flags)
            except libvirt.libvirtError as e:
                raise LibvirtError(
                    f"attaching {h.alias} ({h.source}) to {domain_name} failed: "
                    f"{e.get_error_message()}"
                ) from e
            done.append(h.alias)
        return Outcome(domain_name, "attached", tuple(done))
    finally:
        conn.close()


def define_or_attach(
    uri: str,
    build: Callable[[str | None], Sequence[Hostdev]],
    *,
    domain_xml: str | None = None,
    domain_name: str | None = None,
    live: bool = False,
) -> Outcome:
    """Place the hostdevs ``build(domain XML or None)`` returns, and define or hot-plug them.

    - ``live``: :func:`attach` to the running ``domain_name`` (placed against ``domain_xml``
      when given);
    - else :func:`define`: merged into ``domain_xml``, or into ``domain_name``'s persistent
      XML, which is read first so that multifunction placement sees the slots the domain
      already uses.
    """
    if live:
        if domain_name is None:
            raise TranslateUsageError("--live needs --domain NAME")
        return attach(uri, domain_name, build(domain_xml))
    if domain_xml is None:
        if domain_name is None:
            raise TranslateUsageError("with --connect give --domain-xml FILE or --domain NAME")
        domain_xml = persistent_xml(uri, domain_name)
    outcome, _ = define(uri, build(domain_xml), domain_xml=domain_xml, domain_name=domain_name)
    return outcome


def _lookup(conn: libvirt.virConnect, name: str, uri: str) -> libvirt.virDomain:
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as e:
        raise LibvirtError(
            f"no domain {name!r} at {uri}: {e.get_error_message()}; list them with: "
            f"virsh -c {uri} list --all"
        ) from e
