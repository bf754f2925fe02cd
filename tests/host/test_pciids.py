"""vfio_dp.host.pciids.load_names on a pci.ids file in the database's own format."""

from __future__ import annotations

from pathlib import Path

from vfio_dp.host.pciids import load_names

# The format of pci.ids: vendor lines, a tab before devices, two before subsystems, comments,
# and the class section (``C xx``) at the end, whose lines look like vendors and devices.
PCI_IDS = """\
#
#\tList of PCI ID's
#
# Vendors, devices and subsystems.
10de  NVIDIA Corporation
\t1eb8  TU104GL [Tesla T4]
\t\t10de 12a2  TU104GL [Tesla T4]
\t10f8  TU104 HD Audio Controller
1af4  Red Hat, Inc.
\t1000  Virtio network device
\t1001  Virtio block device

8086  Intel Corporation
\t10d3  82574L Gigabit Network Connection
C 02  Network controller
\t00  Ethernet controller
C 03  Display controller
"""


def _db(tmp_path: Path) -> str:
    p = tmp_path / "pci.ids"
    p.write_text(PCI_IDS)
    return str(p)


def test_vendor_and_device_names(tmp_path: Path) -> None:
    names = load_names({("10de", "1eb8"), ("10de", "10f8"), ("8086", "10d3")}, _db(tmp_path))
    assert names == {
        ("10de", None): "NVIDIA Corporation",
        ("10de", "1eb8"): "TU104GL [Tesla T4]",
        ("10de", "10f8"): "TU104 HD Audio Controller",
        ("8086", None): "Intel Corporation",
        ("8086", "10d3"): "82574L Gigabit Network Connection",
    }


def test_only_what_was_asked_and_never_subsystems_or_classes(tmp_path: Path) -> None:
    names = load_names({("1af4", "1001"), ("10de", "12a2"), ("0002", "0000")}, _db(tmp_path))
    # 1af4:1000 was not asked for; "10de 12a2" is a subsystem line, not device 12a2; class
    # "C 02" / "\t00" lines are not vendor 0002's devices
    assert names == {
        ("1af4", None): "Red Hat, Inc.",
        ("1af4", "1001"): "Virtio block device",
        ("10de", None): "NVIDIA Corporation",
    }


def test_unknown_ids_and_nothing_asked(tmp_path: Path) -> None:
    assert load_names({("abcd", "0001")}, _db(tmp_path)) == {}
    assert load_names(set(), _db(tmp_path)) == {}


def _parsed(text: str) -> dict[tuple[str, str | None], str]:
    """Every vendor and device name, by reading the file line by line (the reference)."""
    out: dict[tuple[str, str | None], str] = {}
    vendor = None
    for line in text.splitlines():
        if line.startswith("C "):
            break
        if line and line[0] not in "\t#":
            vendor = line[:4]
            out[(vendor, None)] = line[6:].strip()
        elif line.startswith("\t") and not line.startswith("\t\t") and vendor:
            out[(vendor, line[1:5])] = line[7:].strip()
    return out


def test_ids_out_of_order_in_the_file_are_still_found(tmp_path: Path) -> None:
    # the search goes forward through sorted IDs; a file whose vendors and devices are not in
    # ascending order (8086 before 10de, 1eb8 before 10f8) must give the same names
    text = (
        "8086  Intel Corporation\n\t10d3  82574L\n\t0100  2nd Generation Core\n"
        "10de  NVIDIA Corporation\n\t1eb8  TU104GL\n\t10f8  TU104 HD Audio\n"
        "1af4  Red Hat, Inc.\n\t1001  Virtio block device\nC 02  Network controller\n"
    )
    p = tmp_path / "pci.ids"
    p.write_text(text)
    every = _parsed(text)
    wanted = {k for k in every if k[1] is not None}
    assert load_names(wanted, str(p)) == every  # the vendor on the first line too
    for one in sorted(wanted):
        assert load_names({one}, str(p)) == {k: every[k] for k in ((one[0], None), one)}
