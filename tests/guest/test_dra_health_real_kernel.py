"""DRA device health on a real kernel with an emulated Intel IOMMU (one guest boot).

A prepared e1000e unbound underneath the plugin → UNHEALTHY on the health stream with the
reason, a NoSchedule taint on its slice, the claim's Ready condition False; rebound → HEALTHY,
taint gone. The shared e1000 group losing one function to the host driver likewise, with its
CDI spec and /dev/vfio/<N> kept (nothing withdrawn while the claim lasts). Real kernel
uevents drive it (``--resync 5``): the times are printed; the 1 s target is checked against
the first signal (the stream), with the emulation's slowness noted in the report, not hidden.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Guest

pytestmark = pytest.mark.guest

LONE, SHARED_A, SHARED_B = "0000:01:00.0", "0000:03:01.0", "0000:03:02.0"
DRIVER = "vfio.dra.vfio-dp.io"


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    res = guest.run('"$PYTHON" tests/guest/scenarios/dra_health_scenario.py', timeout=1500)
    assert "dra_health.json" in res.files, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    out: dict[str, Any] = json.loads(res.files["dra_health.json"])
    assert "crash" not in out, out["crash"]
    print("\nDRA health timings in the guest (s):", {
        k: {t: out[k][t] for t in ("writes", "stream", "taint", "condition") if t in out[k]}
        for k in ("unbind", "rebind", "host_driver", "host_driver_back")
    })  # fmt: skip
    return out


def test_prepared_and_healthy(run: dict[str, Any]) -> None:
    assert run["health_version"] == "v1.DRAResourceHealth"
    assert run["initial"]["lone"][0] == "Healthy"  # bind: onPrepare, idle on e1000e
    assert set(run["drivers_prepared"].values()) == {"vfio-pci"}
    assert run["ready_prepared"] == {"vm-lone": "True", "vm-shared": "True"}
    assert "timeouts" not in run, run["timeouts"]


def test_unbound_underneath_unhealthy_tainted_condition_false(run: dict[str, Any]) -> None:
    u = run["unbind"]
    assert u["published"], "a prepared device is never withdrawn"
    assert f"{LONE} (8086:10d3) was unbound from vfio-pci" in u["message"]
    (taint,) = u["taints"]
    assert taint["key"] == f"{DRIVER}/unhealthy" and taint["value"] == "unbound"
    assert taint["effect"] == "NoSchedule"
    (status,) = u["pod"]["containerStatuses"][0]["allocatedResourcesStatus"]
    assert status["resources"][0]["health"] == "Unhealthy"
    assert 0 <= u["stream"] <= 1.0, u
    assert u["taint"] >= 0 and u["condition"] >= 0


def test_rebound_healthy_again(run: dict[str, Any]) -> None:
    r = run["rebind"]
    assert r["driver"] == "vfio-pci" and 0 <= r["stream"] <= 1.0, r
    assert r["taint"] >= 0 and r["condition"] >= 0


def test_shared_group_losing_a_function_to_the_host(run: dict[str, Any]) -> None:
    h = run["host_driver"]
    assert h["driver"] == "e1000"
    assert f"{SHARED_B} (8086:100e, e1000) left vfio-pci for host driver e1000" in h["message"]
    assert h["taints"][0]["value"] == "host-driver"
    assert h["devnode"] and h["cdi_spec"], "nothing withdrawn while the claim lasts"
    assert 0 <= h["stream"] <= 1.0 and h["condition"] >= 0, h
    assert run["host_driver_back"]["stream"] >= 0


def test_unprepare_gives_everything_back(run: dict[str, Any]) -> None:
    assert set(run["unprepare"].values()) == {""}
    assert run["drivers_after"] == {LONE: "e1000e", SHARED_A: "e1000", SHARED_B: "e1000"}
    assert run["status_after"] == {"vm-lone": None, "vm-shared": None}
