"""The Makefile's own surface (issue 38.4): ``make help`` lists every target, and ``make
wheel`` / ``make image`` ask scripts/setup.sh only for what they need (no QEMU, libvirt or
vagrant packages to build a pure-Python wheel or an image that builds its own Python)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("qemu", "libvirt", "vagrant", "dpdk", "driverctl", "busybox")


def _phony() -> list[str]:
    text = (REPO / "Makefile").read_text()
    return [t for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for t in line.split()]


def test_make_help_lists_every_target() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^  make (\S+)", out.stdout, re.M)
    assert set(_phony()) <= set(listed), out.stdout
    for target in ("setup", "test", "demo", "wheel", "image", "lint"):
        (line,) = [ln for ln in out.stdout.splitlines() if ln.split()[1:2] == [target]]
        assert len(line.split()) > 2, f"make {target} has no description: {line!r}"


def _setup_list(*args: str) -> list[str]:
    out = subprocess.run(["bash", "scripts/setup.sh", *args, "--list"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize(("target", "needs"), [("wheel", "python3-venv"), ("image", "buildah")])
def test_wheel_and_image_need_no_guest_or_libvirt_packages(target: str, needs: str) -> None:
    packages = _setup_list("--for", target)
    assert needs in packages
    assert [p for p in packages if any(h in p for h in HEAVY)] == []
    assert set(packages) < set(_setup_list())  # the full list still has everything


@pytest.mark.parametrize("target", ["wheel", "image"])
def test_the_target_runs_only_its_own_setup(target: str) -> None:
    out = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"scripts/setup.sh --for {target}" in out.stdout
    assert not re.search(r"scripts/setup\.sh\s*$", out.stdout, re.M), out.stdout


def test_an_unknown_profile_is_refused() -> None:
    out = subprocess.run(["bash", "scripts/setup.sh", "--for", "nope", "--list"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 2 and "give all, wheel or image" in out.stderr


def test_the_targets_keep_python_bytecode_caches() -> None:
    """A caller's PYTHONDONTWRITEBYTECODE does not reach the tests `make check` and `make
    test` run: pytest caches its rewritten test modules (without that, each xdist worker
    rewrites every module's asserts again, ~5 s of CPU) and the processes the tests start
    find the modules compiled."""
    probe = 'probe: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"'
    out = subprocess.run(["make", "-s", f"--eval={probe}", "probe"], cwd=REPO,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"



@pytest.mark.parametrize(("cores", "workers"), [("1", 2), ("2", 4), ("3", 6), ("16", 8)])
def test_the_unit_tests_run_on_two_workers_per_core_at_most_eight(cores: str, workers: int) -> None:
    """`make check` and `make test` give the unit tests two pytest-xdist workers per CPU core
    (nproc's count, which OMP_NUM_THREADS sets here): a unit test waits without a CPU for
    about 40 % of its time, and the second worker on a core runs meanwhile. At most 8: each
    worker collects the whole suite (~3 s of CPU) and holds its modules (~250 MB)."""
    for target in ("check", "test"):
        out = subprocess.run(["make", "-n", target], cwd=REPO,
                             env={**os.environ, "OMP_NUM_THREADS": cores},
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert out.returncode == 0, out.stderr
        runs = re.findall(r"-m pytest .*", out.stdout)
        assert f"-n {workers} --dist loadfile" in runs[0], (target, runs)
