"""The scheduler stand-in (tests/dra/scheduler_standin.py) on the slices our builder makes:
counters (KEP-4815: a group's VFIO and container entries are never both allocated, whichever
claims ask) and binding conditions (KEP-5007: PreBind waits for ``ready``, deallocates on
``failed`` or the timeout), through the API-server stand-in's strict decoding."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import (
    CLAIMS,
    DEVICE_CLASSES,
    SLICES,
    ApiServerStandin,
    Unschedulable,
)
from tests.dra.scheduler_standin import PreBind, SchedulerStandin
from tests.dra.test_personalities import BOTH, NVME, _topology
from vfio_dp.dra.deviceclasses import device_classes, native_device_class
from vfio_dp.dra.personalities import with_personalities
from vfio_dp.dra.slices import NodeRef, build_slices
from vfio_dp.model.config import load_config_text

DRIVER = "vfio.dra.vfio-dp.io"
NODE = "node-a"
NVME_CLASS = "144d-a808.devices.kubevirt.io"
NATIVE_CLASS = f"native.{DRIVER}"


def _setup(api: ApiServerStandin, tmp_path: Path) -> None:
    from tests.dra.topologies import DRA_CONFIG

    devices = with_personalities(_topology(tmp_path), {NVME: BOTH}, DRIVER)
    for s in build_slices(devices, driver=DRIVER, node=NodeRef(NODE), generation=1):
        api.seed(SLICES, s)
    config = load_config_text(DRA_CONFIG, "c.yaml")
    for c in [
        *device_classes(config, DRIVER, [("10de", "1eb8"), ("144d", "a808")]),
        native_device_class(DRIVER),
    ]:
        api.seed(DEVICE_CLASSES, c)


def _claim(api: ApiServerStandin, name: str, device_class: str) -> None:
    api.seed(
        CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "dev",
                            "exactly": {
                                "deviceClassName": device_class,
                                "allocationMode": "ExactCount",
                                "count": 1,
                            },
                        }
                    ]
                }
            },
        },
    )


def _status(api: ApiServerStandin, name: str, device: str, **conditions: str) -> None:
    """Write the claim's ``status.devices`` entry for ``device`` as the DRA driver would."""
    claim = next(c for c in api.objects(CLAIMS, "default") if c["metadata"]["name"] == name)
    entry: dict[str, Any] = {
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "conditions": [
            {
                "type": f"{DRIVER}/{t}",
                "status": v,
                "reason": "Switched" if t == "ready" else "SiblingInUse",
                "message": "m",
                "lastTransitionTime": "2026-11-27T12:00:00Z",
            }
            for t, v in conditions.items()
        ],
    }
    status = {**claim["status"], "devices": [entry]}
    with api.lock:
        api._replace(CLAIMS, "default", name, {**claim, "status": status}, status=True)


def test_the_two_entries_of_a_group_are_never_both_allocated(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    _setup(apiserver, tmp_path)
    sched = SchedulerStandin(apiserver)
    _claim(apiserver, "vm", NVME_CLASS)
    _claim(apiserver, "ctr", NATIVE_CLASS)
    vm = sched.allocate("default", "vm", NODE)
    (result,) = vm["status"]["allocation"]["devices"]["results"]
    assert result["device"] == NVME
    assert result["bindingConditions"] == [f"{DRIVER}/ready"]
    assert result["bindingFailureConditions"] == [f"{DRIVER}/failed"]
    assert vm["status"]["allocation"]["allocationTimestamp"]
    with pytest.raises(Unschedulable, match="1 more device"):  # the group's counter is spent
        sched.allocate("default", "ctr", NODE)
    sched.deallocate("default", "vm")  # the VM's pod ends: the counter is free again
    ctr = sched.allocate("default", "ctr", NODE)
    assert ctr["status"]["allocation"]["devices"]["results"][0]["device"] == f"{NVME}-native"
    _claim(apiserver, "vm2", NVME_CLASS)
    with pytest.raises(Unschedulable):
        sched.allocate("default", "vm2", NODE)


def test_an_incomplete_or_old_pool_is_not_used(apiserver: ApiServerStandin, tmp_path: Path) -> None:
    _setup(apiserver, tmp_path)
    sched = SchedulerStandin(apiserver)
    assert list(sched.pools(NODE)) == [(DRIVER, NODE)]
    devices = with_personalities(_topology(tmp_path / "b"), {}, DRIVER)
    newer = build_slices(devices, driver=DRIVER, node=NodeRef(NODE), generation=2)
    assert len(newer) > 1  # devices and the SR-IOV PF's counters
    for i, s in enumerate(newer):
        apiserver.seed(SLICES, {**s, "metadata": {**s["metadata"], "name": f"x-{i}"}})
        complete = i == len(newer) - 1
        # generation 2 incomplete: the pool is skipped until it is whole, then only it is used
        assert sched.pools(NODE) == (
            {(DRIVER, NODE): sched.pools(NODE)[(DRIVER, NODE)]} if complete else {}
        )
    (current,) = sched.pools(NODE).values()
    assert {s["metadata"]["name"] for s in current} == {f"x-{i}" for i in range(len(newer))}


def test_prebind_binds_once_ready(apiserver: ApiServerStandin, tmp_path: Path) -> None:
    _setup(apiserver, tmp_path)
    sched = SchedulerStandin(apiserver, interval=0.05)
    _claim(apiserver, "vm", NVME_CLASS)
    sched.allocate("default", "vm", NODE)
    assert sched.check("default", "vm") is None  # no condition yet: wait
    _status(apiserver, "vm", NVME, ready="False")
    assert sched.check("default", "vm") is None
    done: list[PreBind] = []
    waiter = threading.Thread(target=lambda: done.append(sched.prebind("default", "vm")))
    waiter.start()
    _status(apiserver, "vm", NVME, ready="True")
    waiter.join(30)
    assert done == [PreBind("bound")]
    claim = next(c for c in apiserver.objects(CLAIMS, "default") if c["metadata"]["name"] == "vm")
    assert claim["status"]["allocation"]  # still allocated


def test_prebind_deallocates_on_failure_and_on_timeout(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    _setup(apiserver, tmp_path)
    now = [0.0]
    sched = SchedulerStandin(apiserver, binding_timeout=600, interval=0.01, clock=lambda: now[0])
    _claim(apiserver, "vm", NVME_CLASS)
    sched.allocate("default", "vm", NODE)
    _status(apiserver, "vm", NVME, ready="False", failed="True")
    decision = sched.prebind("default", "vm")
    assert decision.outcome == "deallocated" and "failed: SiblingInUse" in decision.why
    claim = next(c for c in apiserver.objects(CLAIMS, "default") if c["metadata"]["name"] == "vm")
    assert "allocation" not in claim["status"]
    # allocated again (the pod scheduled again), nobody answers: the timeout deallocates
    _claim(apiserver, "vm2", NVME_CLASS)
    sched.allocate("default", "vm2", NODE)
    now[0] = 601.0
    decision = sched.prebind("default", "vm2")
    assert decision == PreBind("deallocated", "binding timeout 600 s")
    # the counter is free: the container claim gets the group now
    _claim(apiserver, "ctr", NATIVE_CLASS)
    assert sched.allocate("default", "ctr", NODE)["status"]["allocation"]
