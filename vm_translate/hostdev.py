"""libvirt ``<hostdev>`` XML for allocated devices, and merging it into a domain (lxml).

The one module that imports lxml. Each :class:`~vm_translate.allocation.Hostdev` becomes::

    <hostdev mode="subsystem" type="pci" managed="no">
      <source>
        <address domain="0x0000" bus="0x65" slot="0x00" function="0x0"/>
      </source>
      <alias name="ua-hostdevice-nic1"/>
    </hostdev>

A mediated device (:class:`~vm_translate.allocation.MdevSource`) becomes::

    <hostdev mode="subsystem" type="mdev" model="vfio-pci">
      <source>
        <address uuid="83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"/>
      </source>
      <alias name="ua-gpu-vgpu1"/>
    </hostdev>

``managed="no"``: the device is already on vfio-pci (the daemon bound it), so libvirt must
not detach or reattach it. With a multifunction layout the hostdev also carries its guest
address, ``multifunction="on"`` on function 0 of the guest slot::

      <address type="pci" domain="0x0000" bus="0x00" slot="0x10" function="0x0"
               multifunction="on"/>

:func:`merge` puts them into ``<domain><devices>``, replacing any hostdev with the same alias,
so merging twice yields the same domain. Output is pretty-printed and deterministic (golden
files pin it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lxml import etree

from vfio_dp.model.address import PciAddress
from vm_translate.allocation import (
    GuestAddress,
    Hostdev,
    Layout,
    MdevSource,
    Source,
    assign,
    place_multifunction,
)
from vm_translate.entries import Entry
from vm_translate.errors import DomainXmlError


def _parser() -> etree.XMLParser:
    # No entities, no network, no DTD: domain XML may come from a user-supplied file.
    return etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, remove_blank_text=True
    )


#: The XML this module writes and reads, each field declared once (virtinst's style): the
#: fixed attributes of every ``<hostdev>``, and the PCI ``<address>`` attributes with the hex
#: width libvirt prints them in (``domain="0x0000" bus="0x65" slot="0x00" function="0x0"``),
#: shared by the host's ``<source><address>`` and the guest ``<address type="pci">``.
HOSTDEV_ATTRS: Mapping[str, str] = {"mode": "subsystem", "type": "pci", "managed": "no"}
MDEV_HOSTDEV_ATTRS: Mapping[str, str] = {"mode": "subsystem", "type": "mdev", "model": "vfio-pci"}
PCI_ADDRESS_FIELDS: tuple[tuple[str, int], ...] = (
    ("domain", 4),
    ("bus", 2),
    ("slot", 2),
    ("function", 1),
)


def address_attrs(a: PciAddress | GuestAddress) -> dict[str, str]:
    """``a``'s fields as ``<address>`` attributes, in :data:`PCI_ADDRESS_FIELDS` order."""
    return {name: f"0x{getattr(a, name):0{width}x}" for name, width in PCI_ADDRESS_FIELDS}


def address_values(el: etree._Element) -> dict[str, int] | None:
    """An ``<address>`` element's :data:`PCI_ADDRESS_FIELDS` as ints (an absent one is 0, as
    libvirt reads it); None when one is not a number."""
    try:
        return {name: int(el.get(name, "0"), 0) for name, _ in PCI_ADDRESS_FIELDS}
    except ValueError:
        return None


def element(h: Hostdev) -> etree._Element:
    """The ``<hostdev>`` element for one device (see module docstring)."""
    if isinstance(h.source, MdevSource):
        dev = etree.Element("hostdev", dict(MDEV_HOSTDEV_ATTRS))
        etree.SubElement(etree.SubElement(dev, "source"), "address", uuid=h.source.uuid)
        etree.SubElement(dev, "alias", name=h.alias)
        return dev
    dev = etree.Element("hostdev", dict(HOSTDEV_ATTRS))
    source = etree.SubElement(dev, "source")
    etree.SubElement(source, "address", address_attrs(h.source))
    etree.SubElement(dev, "alias", name=h.alias)
    if h.guest is not None:
        attrs = {"type": "pci", **address_attrs(h.guest)}
        if h.guest.multifunction:
            attrs["multifunction"] = "on"
        etree.SubElement(dev, "address", attrs)
    return dev


def _text(el: etree._Element) -> str:
    return etree.tostring(el, encoding="unicode", pretty_print=True)


def render(hostdevs: Iterable[Hostdev]) -> str:
    """The ``<hostdev>`` elements, one after another (an XML fragment, not a document)."""
    return "".join(_text(element(h)) for h in hostdevs)


def parse_domain(domain_xml: str | bytes, source: str = "<domain>") -> etree._Element:
    data = domain_xml.encode() if isinstance(domain_xml, str) else domain_xml
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as e:
        raise DomainXmlError(f"{source}: not well-formed XML: {e}") from e
    if root.tag != "domain":
        raise DomainXmlError(f"{source}: root element is <{root.tag}>, expected a libvirt <domain>")
    return root


def _alias_of(el: etree._Element) -> str | None:
    alias = el.find("alias")
    return None if alias is None else alias.get("name")


def _source_of(el: etree._Element) -> Source | None:
    a = el.find("source/address")
    if el.get("type") == "mdev":
        uuid = None if a is None else a.get("uuid")
        return MdevSource(uuid.lower()) if uuid else None
    values = None if a is None else address_values(a)
    if values is None:
        return None
    try:
        return PciAddress(**values)
    except ValueError:
        return None


def guest_slots_in_use(
    root: etree._Element, bus: int, ignore_aliases: Iterable[str] = ()
) -> frozenset[int]:
    """Guest PCI slots on ``bus`` already taken by devices of the domain (domain 0)."""
    ignored = set(ignore_aliases)
    used: set[int] = set()
    for a in root.iterfind("devices/*/address[@type='pci']"):
        owner = a.getparent()
        if owner is not None and owner.tag == "hostdev" and _alias_of(owner) in ignored:
            continue
        values = address_values(a)
        if values is not None and values["domain"] == 0 and values["bus"] == bus:
            used.add(values["slot"])
    return frozenset(used)


def merge_into(root: etree._Element, hostdevs: Sequence[Hostdev]) -> etree._Element:
    """Replace same-alias hostdevs in ``root`` and append the new ones (in place)."""
    devices = root.find("devices")
    if devices is None:
        devices = etree.SubElement(root, "devices")
    new_aliases = {h.alias for h in hostdevs}
    new_sources = {h.source: h.alias for h in hostdevs}
    for old in devices.findall("hostdev"):
        alias = _alias_of(old)
        if alias in new_aliases:
            devices.remove(old)
            continue
        src = _source_of(old)
        if src is not None and src in new_sources:
            raise DomainXmlError(
                f"the domain already passes {src} through as hostdev alias {alias!r}; "
                f"it cannot also be {new_sources[src]!r} — remove the old <hostdev> first"
            )
    for h in hostdevs:
        devices.append(element(h))
    return root


def merge(domain_xml: str | bytes, hostdevs: Sequence[Hostdev], source: str = "<domain>") -> str:
    """``domain_xml`` with ``hostdevs`` merged in (see :func:`merge_into`), pretty-printed."""
    return _text(merge_into(parse_domain(domain_xml, source), hostdevs))


def build(
    entries: Sequence[Entry],
    env: Mapping[str, str],
    *,
    claims: Mapping[tuple[str, str], Source] | None = None,
    domain_xml: str | bytes | None = None,
    layout: Layout | None = None,
    source: str = "<domain>",
) -> tuple[list[Hostdev], str]:
    """Entries + ``PCI_RESOURCE_*`` env (+ DRA claim addresses) → hostdevs and their XML
    (fragments, or merged domain).

    With a layout and a domain, guest slots the domain already uses on the layout's bus are
    skipped (hostdevs about to be replaced do not count).
    """
    hostdevs = assign(entries, env, claims)
    root = parse_domain(domain_xml, source) if domain_xml is not None else None
    if layout is not None:
        if root is not None:
            used = guest_slots_in_use(root, layout.bus, (h.alias for h in hostdevs))
            layout = Layout(layout.bus, layout.first_slot, layout.used_slots | used)
        hostdevs = place_multifunction(hostdevs, layout)
    if root is None:
        return hostdevs, render(hostdevs)
    return hostdevs, _text(merge_into(root, hostdevs))
