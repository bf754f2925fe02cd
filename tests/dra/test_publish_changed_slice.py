"""The publisher writes only what changed (issue 39 row 3) and shapes the pool for what the
server keeps (issue 36 item 2): the real ``kubernetes`` client against the API-server
stand-in, which counts the slice writes and can drop the fields of a disabled feature gate.

One device changing among 1,024 (4 PFs × 256 VFs, the fleet's node) is one slice written, the
pool's generation kept (one write is atomic: upstream's ResourceSlice controller does the
same); placement is stable across republishes and restarts."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from tests.dra.apiserver_standin import (
    BINDING_FIELDS,
    PARTITIONABLE_FIELDS,
    SLICES,
    ApiServerStandin,
    pool_counter_problems,
    validate_slice,
)
from tests.dra.conftest import NODE
from tests.dra.scheduler_standin import SchedulerStandin
from vfio_dp.dra.apiserver.publisher import SlicePublisher
from vfio_dp.dra.personalities import Offer, with_personalities
from vfio_dp.dra.slices import VF_COUNTER, Consumption, Device, counter_set_name
from vfio_dp.model.address import PciAddress
from vfio_dp.model.dra_metadata import Attribute
from vfio_dp.model.personality import Personality

DRIVER = "vfio.dra.vfio-dp.io"


def _vfs(pfs: int = 4, per_pf: int = 256) -> list[Device]:
    """``pfs`` × ``per_pf`` published VFs, each consuming one of its PF's ``vfs``."""
    out = []
    for p in range(pfs):
        pf = PciAddress.parse(f"0000:{0x10 + p:02x}:00.0")
        for v in range(per_pf):
            bus, dev, fn = 0x10 + p, 1 + v // 8, v % 8
            group = 100 + p * per_pf + v
            out.append(
                Device(
                    f"pci-0000-{bus:02x}-{dev:02x}-{fn}",
                    {
                        "iommuGroup": Attribute("int", group),
                        "kind": Attribute("string", "vfio"),
                        "pfPciBusID": Attribute("string", str(pf)),
                        "resource.kubernetes.io/pciBusID": Attribute(
                            "string", f"0000:{bus:02x}:{dev:02x}.{fn}"
                        ),
                        "vfioDriver": Attribute("string", "vfio-pci"),
                    },
                    consumes=(Consumption(counter_set_name(pf), VF_COUNTER),),
                )
            )
    return sorted(out, key=lambda d: d.name)


def _ours(api: ApiServerStandin) -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in api.objects(SLICES) if s["spec"]["nodeName"] == NODE}


def _where(api: ApiServerStandin) -> dict[str, str]:
    """device name -> the slice that holds it."""
    return {d["name"]: n for n, s in _ours(api).items() for d in s["spec"].get("devices") or []}


def _publisher(api: ApiServerStandin, **kw: Any) -> SlicePublisher:
    return SlicePublisher(api.client(), DRIVER, NODE, watch=False, **kw)


def test_one_changed_device_among_1024_writes_one_slice(apiserver: ApiServerStandin) -> None:
    devices = _vfs()
    pub = _publisher(apiserver)
    assert pub.reconcile(devices)
    first = _ours(apiserver)
    assert len(first) == 17  # 16 device slices of 64 and the PFs' counter slice
    gen = pub.generation
    where = _where(apiserver)
    mark = len(apiserver.requests)
    changed = list(devices)
    i = 500  # a VF moved to another VFIO driver
    changed[i] = replace(
        devices[i], attributes={**devices[i].attributes, "vfioDriver": Attribute("string", "x")}
    )
    assert pub.reconcile(changed)
    (write,) = apiserver.slice_writes(mark)  # exactly one API write
    assert write.method == "PUT" and write.path.endswith("/" + where[devices[i].name])
    now = _ours(apiserver)
    assert pub.generation == gen  # kept: one atomic write
    assert {
        n: s["metadata"]["resourceVersion"] for n, s in now.items() if n != where[devices[i].name]
    } == {
        n: s["metadata"]["resourceVersion"] for n, s in first.items() if n != where[devices[i].name]
    }
    assert _where(apiserver) == where
    # the pool as the scheduler sees it: whole, at one generation, with the new value
    (pool,) = SchedulerStandin(apiserver).pools(NODE).values()
    assert len(pool) == 17
    got = next(
        d for s in pool for d in s["spec"].get("devices") or [] if d["name"] == devices[i].name
    )
    assert got["attributes"]["vfioDriver"] == {"string": "x"}
    assert pool_counter_problems(list(now.values()), allocated=_where(apiserver)) == []
    # nothing changed: nothing written
    mark = len(apiserver.requests)
    assert not pub.reconcile(changed)
    assert apiserver.slice_writes(mark) == []


def test_placement_is_stable_when_devices_come_and_go(apiserver: ApiServerStandin) -> None:
    devices = _vfs(2, 100)
    pub = _publisher(apiserver)
    pub.reconcile(devices)
    where = _where(apiserver)
    gone = devices[150]  # in the third slice
    new = replace(devices[0], name="pci-0000-10-00-0-x")  # sorts early: packed, it would shift all
    later = sorted([*devices[:150], *devices[151:], new], key=lambda d: d.name)
    pub.reconcile(later)
    after = _where(apiserver)
    assert {n: s for n, s in after.items() if n != new.name} == {
        n: s for n, s in where.items() if n != gone.name
    }
    assert after[new.name] == where[gone.name]  # the free place in the lowest slice
    # a restart (a new publisher) keeps them where the server has them
    pub2 = _publisher(apiserver)
    mark = len(apiserver.requests)
    assert not pub2.reconcile(later)  # adopted: nothing written
    assert apiserver.slice_writes(mark) == []
    moved = [replace(d, attributes={**d.attributes, "vfioDriver": Attribute("string", "y")})
             if d.name == devices[20].name else d for d in later]  # fmt: skip
    assert pub2.reconcile(moved)
    assert _where(apiserver) == after


BOTH = Offer((Personality.VM, Personality.CONTAINER), "nvme")


def test_a_server_without_the_fields_gets_the_first_personality_once_said(
    apiserver: ApiServerStandin, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.disabled_fields = set(PARTITIONABLE_FIELDS | BINDING_FIELDS)
    base = _vfs(1, 4)
    devices = with_personalities(base, {d.name: BOTH for d in base}, DRIVER)
    pub = _publisher(apiserver)
    with caplog.at_level(logging.WARNING, logger="vfio_dp.dra"):
        pub.reconcile(devices)
        pub.reconcile([*devices])  # again: nothing more said
    assert not pub.counters_kept and not pub.binding_kept
    said = [r.getMessage() for r in caplog.records if "drops" in r.getMessage()]
    assert len(said) == 2, said  # once for counters, once for binding conditions
    assert sorted(_where(apiserver)) == [d.name for d in base]  # the VFIO entries only
    assert all(validate_slice(s, None) == [] for s in _ours(apiserver).values())
    assert all("sharedCounters" not in s["spec"] for s in _ours(apiserver).values())


def test_binding_conditions_off_or_dropped_alone(apiserver: ApiServerStandin) -> None:
    base = _vfs(1, 2)
    devices = with_personalities(base, {d.name: BOTH for d in base}, DRIVER)
    pub = _publisher(apiserver, binding_conditions=False)  # --binding-conditions=false
    pub.reconcile(devices)
    devs = [d for s in _ours(apiserver).values() for d in s["spec"].get("devices") or []]
    assert len(devs) == 4 and all("consumesCounters" in d for d in devs)
    assert not any("bindingConditions" in d for d in devs)
    # on by default; a server without DRADeviceBindingConditions drops them: both entries stay
    apiserver.disabled_fields = set(BINDING_FIELDS)
    pub2 = SlicePublisher(apiserver.client(), DRIVER, "node-b", watch=False)
    from tests.dra.apiserver_standin import NODES

    apiserver.seed(NODES, {"metadata": {"name": "node-b"}})
    pub2.reconcile(devices)
    assert pub2.counters_kept and not pub2.binding_kept
    mine = [d for s in apiserver.objects(SLICES) if s["spec"]["nodeName"] == "node-b"
            for d in s["spec"].get("devices") or []]  # fmt: skip
    assert len(mine) == 4 and not any("bindingConditions" in d for d in mine)


def _tainted(devices: list[Device]) -> list[Device]:
    """Every device with a NoSchedule taint (1,024 VFs gone bad at once: issue 39 row 1)."""
    taint = {"key": f"{DRIVER}/unhealthy", "value": "unbound", "effect": "NoSchedule"}
    return [replace(d, taints=(taint,)) for d in devices]


def test_a_new_generation_is_written_writers_at_a_time_never_seen_mixed(
    apiserver: ApiServerStandin,
) -> None:
    """A pool written at a new generation goes out WRITERS slices at a time (issue 39 row 1:
    16 writes one after another were most of the 2 s), and no more at once; the scheduler
    sees the old pool whole, then none (the new generation incomplete), then the new one
    whole -- never a pool mixing the two."""
    import threading

    from vfio_dp.dra.apiserver.slice_writes import WRITERS

    devices = _vfs()
    pub = _publisher(apiserver)
    apiserver.gather_slice_writes(WRITERS)
    assert pub.reconcile(devices)
    assert apiserver.slice_writes_most == WRITERS  # reached, never passed
    old = {n: s["spec"] for n, s in _ours(apiserver).items()}
    seen: list[dict[str, Any] | None] = []
    done = threading.Event()

    def look() -> None:
        while not done.is_set():
            pools = SchedulerStandin(apiserver).pools(NODE)
            seen.append({s["metadata"]["name"]: s["spec"] for s in pools[(DRIVER, NODE)]}
                        if pools else None)  # fmt: skip

    watcher = threading.Thread(target=look)
    watcher.start()
    apiserver.slice_writes_most = 0
    apiserver.gather_slice_writes(WRITERS)
    mark = len(apiserver.requests)
    try:
        assert pub.reconcile(_tainted(devices))
    finally:
        done.set()
        watcher.join()
    assert len(apiserver.slice_writes(mark)) == 17  # 16 device slices of 64 and the counters
    assert apiserver.slice_writes_most == WRITERS
    new = {n: s["spec"] for n, s in _ours(apiserver).items()}
    assert None in seen  # the writes were seen under way (held until WRITERS at once)
    assert all(pool in (old, new, None) for pool in seen)
    assert {s["pool"]["generation"] for s in new.values()} == {pub.generation}


def test_the_slice_writes_keep_their_connections(apiserver: ApiServerStandin) -> None:
    """The writes' connection pool keeps WRITERS connections whatever the client config's
    ``connection_pool_maxsize`` (5 per CPU by default: 5 on a 1-CPU node): a second
    publication reuses them, no connection opened and dropped per write."""
    from vfio_dp.dra.apiserver.slice_writes import WRITERS

    client = apiserver.client()
    client.configuration.connection_pool_maxsize = 2
    pub = SlicePublisher(client, DRIVER, NODE, watch=False)
    devices = _vfs()
    for pool in (devices, _tainted(devices), devices):  # each at a new generation
        apiserver.gather_slice_writes(WRITERS)
        assert pub.reconcile(pool)
    assert len(apiserver.slice_write_ports) == 3 * 17
    assert len(set(apiserver.slice_write_ports)) == WRITERS
