"""`vfioctl bind --persist` on a real kernel with a real udevd: the bind comes back at "boot"
before the host driver can take the device, only where the IDs still match (issue 21 item 11).
The boot order re-enacted: tests/guest/scenarios/persist_scenario.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Guest

pytestmark = pytest.mark.guest

LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    res = guest.run('"$PYTHON" tests/guest/scenarios/persist_scenario.py', timeout=600)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    return json.loads(res.files["persist.json"])


def test_persisted_bind_comes_back_before_the_host_driver(run: dict[str, Any]) -> None:
    assert run["bind"]["rc"] == 0, run["bind"]["stderr"]
    assert "persists across reboots" in run["bind"]["stdout"]
    assert run["after_bind"][LONE] == "vfio-pci"
    # the "power off" left no driver loaded and no device on the bus
    assert run["rmmod"]["rc"] == 0, run["rmmod"]["stderr"]
    assert run["gone"] == {LONE: False, LONE2: False}
    assert run["modules_before"]["stdout"].strip() == ""
    assert run["udevd"]["rc"] == 0, run["udevd"]["stderr"]
    assert run["listening"] is not None, "udevd never opened /run/udev/control"
    assert run["settled"] is not None, run
    # udev loaded e1000e (Debian's rules) AND our rule kept 01:00.0 from it
    assert run["after_boot"] == {LONE: "vfio-pci", LONE2: "e1000e"}, run
    assert run["override_after_boot"][LONE] == "vfio-pci"
    assert run["vfio_node"] is True


def test_a_record_whose_ids_no_longer_match_is_not_applied(run: dict[str, Any]) -> None:
    assert 'KERNEL=="0000:02:00.0"' in run["rules"] and '"0xbeef"' in run["rules"]
    assert run["after_boot"][LONE2] == "e1000e"
    assert run["override_after_boot"][LONE2] in ("", "(null)")


def test_unbind_gives_it_back_and_removes_the_rule(run: dict[str, Any]) -> None:
    assert run["unbind"]["rc"] == 0, run["unbind"]["stderr"]
    assert run["after_unbind"][LONE] == "e1000e"
    assert run["unbind_all"]["rc"] == 0, run["unbind_all"]["stderr"]
    assert run["rules_left"] is False and run["record_left"] is False
