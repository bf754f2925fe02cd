"""A checkout may live anywhere: the guest sees a clone under /tmp (with a space in its path).

The guest mounts fresh tmpfs over /tmp, /run and /dev/shm, which hid any checkout there
(``runner.sh: cd: can't cd to /tmp/newcomer``); the rig now exports the checkout on its own.
This test makes such a clone with its own ``.venv`` and runs the rig FROM it, as a newcomer's
``make test`` would: the guest must start in the clone and run the clone's interpreter on the
clone's code. One boot.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .rig import GUEST_TMPFS_DIRS, guest_shares, repo_root

if TYPE_CHECKING:
    from .conftest import Guest

_SKIP = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.egg-info"
)

_SCRIPT = r"""
echo "cwd=$(pwd)"
echo "PYTHON=$PYTHON"
"$PYTHON" -c '
import sys, vfio_dp
from tests.guest import rig
print("prefix=" + sys.prefix)
print("module=" + vfio_dp.__file__)
print("in_guest=%s" % rig.in_guest())
'
touch written-in-guest && echo "writable=yes"
"""


@pytest.fixture()
def clone_in_tmp() -> Iterator[Path]:
    """A copy of this checkout at ``/tmp/vfio dp clone XXXX/newcomer`` with its own .venv.

    The venv is made without pip and points at the clone with a ``.pth`` line, as setup.sh's
    editable install does; the rig itself needs only the standard library.
    """
    top = Path(tempfile.mkdtemp(prefix="vfio dp clone ", dir="/tmp"))
    try:
        clone = top / "newcomer"
        shutil.copytree(repo_root(), clone, ignore=_SKIP, symlinks=True)
        base_python = os.path.realpath(sys.executable)
        subprocess.run(
            [base_python, "-m", "venv", "--without-pip", str(clone / ".venv")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        purelib = sysconfig.get_path(
            "purelib", vars={"base": str(clone / ".venv"), "platbase": str(clone / ".venv")}
        )
        Path(purelib, "_vfio_dp_clone.pth").write_text(f"{clone}\n")
        yield clone
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _kv(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"(?m)^([a-z_A-Z]+)=(.*)$", text)}


def test_clone_under_tmp_with_a_space_runs_in_the_guest(guest: Guest, clone_in_tmp: Path) -> None:
    del guest  # proves the rig (kernel + initrd, shared cache) is available, or fails/skips
    python = clone_in_tmp / ".venv/bin/python"
    proc = subprocess.run(
        [str(python), str(clone_in_tmp / "tests/guest/rig.py"), "-c", _SCRIPT, "--timeout", "120"],
        cwd=clone_in_tmp,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kv = _kv(proc.stdout)
    assert kv["cwd"] == str(clone_in_tmp)
    assert kv["PYTHON"] == str(python)
    assert kv["prefix"] == str(clone_in_tmp / ".venv")
    assert kv["module"] == str(clone_in_tmp / "vfio_dp/__init__.py")
    assert kv["in_guest"] == "True"
    assert kv["writable"] == "yes"
    assert not (clone_in_tmp / "written-in-guest").exists(), "the guest wrote to the host"


# ---------------------------------------------------------------- which paths are shared


@pytest.mark.parametrize("top", GUEST_TMPFS_DIRS)
def test_shares_a_venv_and_a_module_tree_that_the_tmpfs_would_hide(
    top: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = f"{top}/some venv"
    monkeypatch.setattr(sys, "prefix", venv)
    monkeypatch.setattr(sys, "executable", f"{venv}/bin/python")
    shares = guest_shares(Path(f"{top}/cache/lib/modules/6.1.0-56-amd64"))
    assert str(repo_root()) in shares
    assert os.path.realpath(venv) in shares
    assert os.path.realpath(f"{top}/cache/lib/modules/6.1.0-56-amd64") in shares


def test_shares_nothing_inside_another_share(monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(repo_root())
    monkeypatch.setattr(sys, "prefix", f"{root}/.venv")
    monkeypatch.setattr(sys, "executable", f"{root}/.venv/bin/python")
    shares = guest_shares(Path(f"{root}/.cache/lib/modules/x"))
    assert root in shares
    assert not [s for s in shares if s != root and s.startswith(root + "/")]
