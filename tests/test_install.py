"""The CLI installs where operators need it (issue 33): the wheel into a clean venv on a node
with no compiler (what ``pipx install dist/vfio_dp-*.whl`` does), and ``hostdev --connect``
without the optional ``vfio-dp[libvirt]`` extra says in one line how to get it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sysfs_tree import gpu_host

REPO = Path(__file__).resolve().parent.parent
VMI = """\
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vm1, namespace: ns}
spec:
  domain:
    devices:
      hostDevices: [{name: nic, deviceName: "8086:10d3"}]
"""
ENV = {"PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3": "0000:65:00.0"}
#: the package build reads only these (as deploy/Containerfile copies them)
SOURCES = ("pyproject.toml", "README.md", "vfio_dp", "vm_translate", "cli")
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "x86_64-linux-gnu-gcc")


def _one_line_how_to_get_libvirt(p: subprocess.CompletedProcess[str]) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("vfioctl: --connect needs libvirt-python")
    assert "pip install 'vfio-dp[libvirt]'" in lines[0]


def test_hostdev_connect_without_libvirt_says_how_to_get_it(tmp_path: Path) -> None:
    (tmp_path / "vmi.yaml").write_text(VMI)
    # Python's own rule: a None in sys.modules makes `import libvirt` raise ImportError, as
    # where libvirt-python is not installed (the clean-venv test below has it truly absent)
    code = "import sys; sys.modules['libvirt'] = None; from cli.main import main; main()"
    p = subprocess.run(
        [sys.executable, "-c", code, "hostdev", str(tmp_path / "vmi.yaml"), "--connect",
         "test:///default", "--domain", "test"],
        env=os.environ | ENV, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    _one_line_how_to_get_libvirt(p)


@pytest.fixture(scope="module")
def clean_install(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[str, str]]]:
    """The wheel built from a copy of the sources, installed into a fresh venv with pip run
    under a PATH that holds no compiler: (the venv's bin, its environment)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    dist = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("vfio_dp-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CC", "CXX")
    }
    env["PATH"] = str(bin_dir)  # nothing else: no gcc, cc, pkg-config
    for compiler in COMPILERS:
        assert shutil.which(compiler, path=env["PATH"]) is None, compiler
    # no pip cache: a node has none, and this machine's holds a libvirt-python wheel built
    # by scripts/setup.sh that would hide a dependency needing a compiler
    p = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-cache-dir", str(wheel)],
        env=env, capture_output=True, text=True, timeout=900, cwd=tmp,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    yield bin_dir, env


@pytest.mark.install
@pytest.mark.timeout(1200)  # building the wheel and installing its dependencies: ~2 min here
def test_the_wheel_installs_without_a_compiler_and_vfioctl_runs(
    clean_install: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = clean_install
    vfioctl = str(bin_dir / "vfioctl")

    def run(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [vfioctl, *args], env=env | (extra or {}), capture_output=True, text=True,
            timeout=120, cwd=tmp_path,
        )  # fmt: skip

    # libvirt-python is not there: it is the extra, not a dependency
    absent = subprocess.run(
        [str(bin_dir / "python"), "-c", "import libvirt"], env=env, capture_output=True
    )
    assert absent.returncode != 0
    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert "\n  list " in helped.stdout and "\n  hostdev " in helped.stdout
    tree = tmp_path / "tree"
    gpu_host(tree)
    listed = run("list", "--root", str(tree), "-o", "json")
    assert listed.returncode == 0, listed.stderr
    here = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "list", "--root", str(tree),
         "-o", "json"],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert json.loads(listed.stdout) == json.loads(here.stdout)
    (tmp_path / "vmi.yaml").write_text(VMI)
    connect = run("hostdev", str(tmp_path / "vmi.yaml"), "--connect", "test:///default",
                  "--domain", "test", extra=ENV)  # fmt: skip
    _one_line_how_to_get_libvirt(connect)
