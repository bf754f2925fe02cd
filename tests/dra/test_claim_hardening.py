"""One bad claim must not fail the others (issue 20, items 3, 6, 7, 9): wrongly typed or
oversized ResourceClaims, a UID arriving under a second name, and OS errors in the CDI,
metadata and state directories -- each an error of THAT claim, naming the field or the path,
while the good claim of the same request is prepared. Real temp trees, the kernel simulator,
and real filesystem conditions (a directory where a spec goes, a read-only directory)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.counting_host import CountingHost
from tests.dra.test_prepare import CONFIG as PREPARE_CONFIG
from tests.dra.test_prepare import Claims, _preparer, _spec, result, run
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath import cdi
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.dra.claimpath.claims import MAX_RESULTS, ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.model.config import Config, load_config_text

DRIVER = "vfio.example.com"
CONFIG = """
selectors:
  - vendor: "8086"
    device: "100e"
    path: dra
    bind: onPrepare
  - vendor: "10de"
    path: dra
    bind: onPrepare
"""


@pytest.fixture
def config() -> Config:
    return load_config_text(CONFIG, "test")


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "cdi"), str(tmp_path / "plugins")


@pytest.fixture
def preparer(
    tree: SysfsTree, kernel: SimulatedKernel, config: Config, claims: Claims, dirs: tuple[str, str]
) -> ClaimPreparer:
    return _preparer(tree, kernel, config, claims, dirs)


def _good(claims: Claims) -> ClaimRef:
    return claims.add("vm-good", "uid-good", [result("pci-0000-03-01-0")])


def _bad(claims: Claims, where: str, value: Any) -> ClaimRef:
    ref = claims.add("vm-bad", "uid-bad", [result("pci-0000-3b-00-0", request="gpu")])
    obj = claims.objects[("default", "vm-bad")]
    if where == "annotation":
        obj["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": value}
    elif where == "requests":
        devices = obj["status"]["allocation"]["devices"]
        devices["config"] = [{"requests": value, "opaque": {"driver": DRIVER, "parameters": {}}}]
    else:
        obj["status"]["allocation"]["devices"][where] = value
    return ref


# -- item 6: wrongly typed fields --------------------------------------------------------------
@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("results", 5, "status.allocation.devices.results must be a list, got int"),
        ("results", [5], "status.allocation.devices.results[0] must be an object"),
        ("results", [{"request": 7, "driver": DRIVER}], "results[0].request must be a string"),
        ("config", 7, "status.allocation.devices.config must be a list, got int"),
        ("requests", 5, "status.allocation.devices.config[0].requests must be a list"),
        ("annotation", 5, "[resource.kubernetes.io/pod-claim-name] must be a string, got int"),
        ("annotation", ["gpu"], "pod-claim-name] must be a string, got list"),
    ],
)
def test_a_wrongly_typed_field_fails_that_claim_only(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    preparer: ClaimPreparer,
    claims: Claims,
    where: str,
    value: Any,
    field: str,
) -> None:
    good, bad = _good(claims), _bad(claims, where, value)
    out = run(preparer.prepare([bad, good]))
    assert out["uid-good"].error == "" and out["uid-good"].devices
    err = out["uid-bad"].error
    assert err.startswith("claim default/vm-bad (uid uid-bad): field ") and field in err, err
    assert tree.driver_of("0000:3b:00.0") == "nvidia"  # nothing of the bad claim was bound
    assert preparer.checkpoint.get("uid-bad") is None


def test_reconcile_keeps_a_malformed_claim_and_says_why(
    preparer: ClaimPreparer, claims: Claims
) -> None:
    good = _good(claims)
    assert run(preparer.prepare([good]))["uid-good"].error == ""
    claims.objects[("default", "vm-good")]["status"]["allocation"]["devices"]["results"] = 5
    report = run(preparer.reconcile())
    assert report.unprepared == []
    assert any("results must be a list" in e for e in report.errors), report.errors
    assert preparer.checkpoint.get("uid-good") is not None


# -- item 3: refuse what cannot be valid before any work ----------------------------------------
def test_more_results_than_a_claim_may_hold_is_refused_before_any_file(
    kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    many = [result("pci-0000-03-01-0", request=f"r{i}") for i in range(MAX_RESULTS + 1)]
    ref = claims.add("vm-many", "uid-many", many)
    err = run(preparer.prepare([ref]))["uid-many"].error
    assert f"has {MAX_RESULTS + 1} entries; a claim holds at most {MAX_RESULTS}" in err, err
    assert not os.path.exists(dirs[1]) and not os.path.exists(dirs[0])
    assert kernel.writes == [] and preparer.checkpoint.get("uid-many") is None


def test_the_limit_itself_is_accepted(preparer: ClaimPreparer, claims: Claims) -> None:
    others = [
        {**result(f"gpu-{i}", request=f"r{i}"), "driver": "gpu.nvidia.com"}
        for i in range(MAX_RESULTS - 1)
    ]
    ref = claims.add("vm-32", "uid-32", [*others, result("pci-0000-03-01-0")])
    assert run(preparer.prepare([ref]))["uid-32"].error == ""


def test_a_device_allocated_twice_in_one_claim_is_refused_before_any_file(
    kernel: SimulatedKernel, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    twice = [result("pci-0000-03-01-0", request=f"r{i}") for i in range(2)]
    ref = claims.add("vm-twice", "uid-twice", twice)
    err = run(preparer.prepare([ref]))["uid-twice"].error
    assert "device pci-0000-03-01-0: allocated twice" in err, err
    assert not os.path.exists(dirs[1]) and kernel.writes == []


# -- item 9: one UID, two names ------------------------------------------------------------------
def test_the_same_uid_under_another_name_is_refused_naming_both(
    preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    first = claims.add("vm-a", "uid-same", [result("pci-0000-03-01-0")], namespace="ns1")
    assert run(preparer.prepare([first]))["uid-same"].error == ""
    meta = f"{dirs[1]}/{DRIVER}/dra-device-metadata/uid-same/nic/{DRIVER}-metadata.json"
    before = Path(meta).read_bytes()
    second = claims.add("vm-b", "uid-same", [result("pci-0000-3b-00-0")], namespace="ns2")
    err = run(preparer.prepare([second]))["uid-same"].error
    assert "ns1/vm-a" in err and "ns2/vm-b" in err, err
    assert Path(meta).read_bytes() == before and mdfile.read(meta).name == "vm-a"
    rec = preparer.checkpoint.get("uid-same")
    assert rec is not None and (rec.namespace, rec.name) == ("ns1", "vm-a")
    # nor may the second name give back the first claim's devices
    err = run(preparer.unprepare([second]))["uid-same"]
    assert "ns1/vm-a" in err and "ns2/vm-b" in err, err
    assert _spec(dirs, "uid-same") is not None
    assert run(preparer.unprepare([first])) == {"uid-same": ""}


# -- item 7: OS errors per claim, with the path and the fix ---------------------------------------
def test_unprepare_with_a_directory_at_a_spec_path_leaves_it_and_forgets_the_claim(
    preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    """Issue 37 item 18b changed this answer: a directory where the spec should be is not
    ours; failing the Unprepare on it failed it at every retry, forever. It is left (and
    logged: tests/dra/test_claim_files_faults.py), the claim is given back and forgotten,
    and the other claim of the call is unaffected either way."""
    a = claims.add("vm-a", "uid-a", [result("pci-0000-03-01-0")])
    b = claims.add("vm-b", "uid-b", [result("pci-0000-3b-00-0", request="gpu")])
    assert all(r.error == "" for r in run(preparer.prepare([a, b])).values())
    path = cdi.spec_path(dirs[0], DRIVER, "uid-a")
    os.unlink(path)
    os.mkdir(path)
    out = run(preparer.unprepare([a, b]))
    assert out["uid-b"] == "" and _spec(dirs, "uid-b") is None
    assert out["uid-a"] == "" and os.path.isdir(path)
    assert preparer.checkpoint.get("uid-a") is None


@pytest.fixture
def full_cdi_dir(dirs: tuple[str, str]) -> Iterator[str]:
    """A real, full 64 KiB tmpfs at the CDI directory (ENOSPC on the next write)."""
    os.makedirs(dirs[0])
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dirs[0]],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {done.stderr}")
    try:
        with contextlib.suppress(OSError), open(os.path.join(dirs[0], "filler"), "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
        yield dirs[0]
    finally:
        subprocess.run(["umount", dirs[0]], check=True)


def test_enospc_in_the_cdi_dir_names_the_path_and_the_fix_per_claim(
    full_cdi_dir: str, preparer: ClaimPreparer, claims: Claims, dirs: tuple[str, str]
) -> None:
    a = claims.add("vm-a", "uid-a", [result("pci-0000-03-01-0")])
    b = claims.add("vm-b", "uid-b", [result("pci-0000-3b-00-0", request="gpu")])
    out = run(preparer.prepare([a, b]))
    for uid, name in (("uid-a", "vm-a"), ("uid-b", "vm-b")):
        err = out[uid].error
        assert err.startswith(f"claim default/{name} (uid {uid}): writing the CDI spec "), err
        assert cdi.spec_path(full_cdi_dir, DRIVER, uid) in err, err
        assert "No space left on device" in err and "free space" in err, err
    os.unlink(os.path.join(full_cdi_dir, "filler"))  # space again: the retry succeeds
    assert all(r.error == "" for r in run(preparer.prepare([a, b])).values())
    assert _spec(dirs, "uid-a") is not None and _spec(dirs, "uid-b") is not None


def test_a_read_only_state_dir_names_the_checkpoint(
    tree: SysfsTree, preparer: ClaimPreparer, claims: Claims
) -> None:
    state = tree.root / "var/lib/vfio_dp"
    state.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(state)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {done.stderr}")
    try:
        a = claims.add("vm-a", "uid-a", [result("pci-0000-03-01-0")])
        err = run(preparer.prepare([a]))["uid-a"].error
    finally:
        subprocess.run(["umount", str(state)], check=True)
    assert err.startswith("claim default/vm-a (uid uid-a): "), err
    assert preparer.checkpoint.path in err and "read-only" in err.lower(), err
    assert "mount it read-write" in err, err
    assert tree.driver_of("0000:03:01.0") == "e1000"  # refused before the bind


# -- item 3: a batch is not quadratic ------------------------------------------------------------
def test_the_claims_of_one_call_read_only_their_own_groups(
    tree: SysfsTree, kernel: SimulatedKernel, claims: Claims, dirs: tuple[str, str]
) -> None:
    host = CountingHost(tree.root, kernel=kernel)
    config = load_config_text(PREPARE_CONFIG, "test")
    p = ClaimPreparer(
        host=host, driver=DRIVER, node="node-a", cdi_dir=dirs[0], plugins_dir=dirs[1],
        read_claim=claims.read, config=lambda: config,
    )  # fmt: skip
    lone = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
    nic = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    puts = 0  # records stored (staged: the call writes them to disk once, before answering)
    real_stage = p.checkpoint.stage

    def counting_stage(record: Any) -> Any:
        nonlocal puts
        puts += 1
        return real_stage(record)

    p.checkpoint.stage = counting_stage  # type: ignore[method-assign]
    out = run(p.prepare([lone, nic]))
    assert all(r.error == "" for r in out.values()), out
    # no full scan: each claim reads its own group (the bind plans from that read), then the
    # bound group alone is re-read
    assert (host.scans, host.refreshes, host.rereads) == (0, 0, 1)
    assert sorted(host.group_reads) == [["0000:03:01.0"], ["0000:65:00.0"]]
    # the claim with nothing to bind is recorded once; the binding one before and after
    assert puts == 3
