import pytest

from vfio_dp.errors import AddressError, UsageError
from vfio_dp.model.address import PciAddress, parse_many


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("0000:65:00.0", "0000:65:00.0"),
        ("65:00.0", "0000:65:00.0"),
        ("0000:AF:1F.7", "0000:af:1f.7"),
        ("ffff:ff:1f.7", "ffff:ff:1f.7"),
        ("3b:00.1", "0000:3b:00.1"),
    ],
)
def test_round_trip(text: str, printed: str) -> None:
    a = PciAddress.parse(text)
    assert str(a) == printed
    assert PciAddress.parse(str(a)) == a


@pytest.mark.parametrize(
    "bad",
    [
        "../",
        "../../etc/passwd",
        "/sys/bus/pci/devices/0000:65:00.0",
        "0000:65:00.*",
        "0000:65:20.0",
        "0000:65:00.8",
        "000:65:00.0",
        "0000:65:00.0 ",
        " 0000:65:00.0",
        "0000:65:00.0/..",
        "0000:65:00",
        "g000:65:00.0",
        "",
        "0000:065:00.0",
        "0000:65:00.0\n",
    ],
)
def test_rejects(bad: str) -> None:
    with pytest.raises(AddressError) as e:
        PciAddress.parse(bad)
    assert isinstance(e.value, UsageError)
    assert repr(bad) in str(e.value)


def test_order_and_physical() -> None:
    a, b, c = (PciAddress.parse(x) for x in ("0000:3b:00.1", "0000:3b:00.0", "0000:0a:00.0"))
    assert sorted([a, b, c]) == [c, b, a]
    assert a.physical == b.physical != c.physical


def test_parse_many_dedups_in_order() -> None:
    got = parse_many(["65:00.0", "0000:3b:00.0", "0000:65:00.0"])
    assert [str(x) for x in got] == ["0000:65:00.0", "0000:3b:00.0"]
