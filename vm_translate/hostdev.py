"""libvirt ``<hostdev>`` XML for allocated devices, and merging it into a domain (lxml).

The one module that imports lxml. Each :class:`~vm_translate.allocation.Hostdev` becomes::

    <hostdev mode="subsystem" type="pci" managed="no">
      <source>
        <address domain="0x0000" bus="0x65" slot="0x00" function="0x0"/>
      </source>
      <alias name="ua-hostdevice-nic1"/>
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
from vm_translate.allocation import Hostdev, Layout, assign, place_multifunction
from vm_translate.errors import DomainXmlError
from vm_translate.spec import Entry


def _parser() -> etree.XMLParser:
    # No entities, no network, no DTD: domain XML may come from a user-supplied file.
    return etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, remove_blank_text=True
    )


def element(h: Hostdev) -> etree._Element:
    """The ``<hostdev>`` element for one device (see module docstring)."""
    dev = etree.Element("hostdev", mode="subsystem", type="pci", managed="no")
    source = etree.SubElement(dev, "source")
    _address(source, h.source)
    etree.SubElement(dev, "alias", name=h.alias)
    if h.guest is not None:
        g = h.guest
        attrs = {
            "type": "pci",
            "domain": f"0x{g.domain:04x}",
            "bus": f"0x{g.bus:02x}",
            "slot": f"0x{g.slot:02x}",
            "function": f"0x{g.function:x}",
        }
        if g.multifunction:
            attrs["multifunction"] = "on"
        etree.SubElement(dev, "address", attrs)
    return dev


def _address(parent: etree._Element, a: PciAddress) -> None:
    etree.SubElement(
        parent,
        "address",
        domain=f"0x{a.domain:04x}",
        bus=f"0x{a.bus:02x}",
        slot=f"0x{a.slot:02x}",
        function=f"0x{a.function:x}",
    )


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


def _source_of(el: etree._Element) -> PciAddress | None:
    a = el.find("source/address")
    if a is None:
        return None
    try:
        return PciAddress(
            int(a.get("domain", "0"), 0),
            int(a.get("bus", "0"), 0),
            int(a.get("slot", "0"), 0),
            int(a.get("function", "0"), 0),
        )
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
        try:
            if int(a.get("domain", "0"), 0) == 0 and int(a.get("bus", "0"), 0) == bus:
                used.add(int(a.get("slot", "0"), 0))
        except ValueError:
            continue
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
    claims: Mapping[tuple[str, str], PciAddress] | None = None,
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
