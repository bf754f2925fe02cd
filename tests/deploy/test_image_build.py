"""deploy/Containerfile really builds, and the image's vfioctl runs (minutes: marked ``image``).

No container registry can be reached from the machines this runs on (only Debian's and
PyPI's package archives), so the base image is made from Debian's packages: ``mmdebstrap``
writes a Debian 12 root file system with ``python3`` and ``python3-venv`` (what the official
``python:3.11-slim-bookworm`` default provides), ``buildah`` imports it and builds the
Containerfile with ``--build-arg PYTHON_IMAGE=<that image>`` -- the same file users build.
The base is cached under ``$VFIO_DP_CACHE/image`` (default ``~/.cache/vfio_dp/image``); the
project image is built from scratch every time and removed afterwards.

Build isolation is ``chroot``: in these machines' containers the OCI runtime (crun) may not
set the container's rlimits (``setrlimit RLIMIT_NOFILE: Operation not permitted``). The build
mounts the host's CA bundle and a two-line pip.conf pointing at it into its RUN steps only,
so pip trusts a TLS-intercepting proxy where there is one; nothing of it lands in the image.

Then, in the built image, with its own ENTRYPOINT and USER (65532): ``vfioctl --help`` and
``vfioctl list --root /tree -o json`` on a real temp sysfs tree, which must list what the
checkout's own vfioctl lists there.

Missing tools fail with the package to install (scripts/setup.sh installs them);
``VFIO_DP_SKIP_IMAGE=1`` skips instead, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import REPO
from tests.sysfs_tree import gpu_host

pytestmark = pytest.mark.image

BASE_TAG = "localhost/vfio-dp-test-base:bookworm-python3"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed (Debian package {package}; scripts/setup.sh installs it)"
        if os.environ.get("VFIO_DP_SKIP_IMAGE") == "1":
            pytest.skip(f"VFIO_DP_SKIP_IMAGE=1: {msg}")
        pytest.fail(msg, pytrace=False)
    return path


def _run(argv: list[str], *, timeout: float = 1800, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}\n"
        f"--- stdout (tail) ---\n{proc.stdout[-4000:]}\n--- stderr (tail) ---\n{proc.stderr[-4000:]}"
    )
    return proc


def _cache() -> Path:
    base = os.environ.get("VFIO_DP_CACHE") or os.path.join(Path.home(), ".cache", "vfio_dp")
    path = Path(base) / "image"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def timings() -> dict[str, float]:
    return {}


@pytest.fixture(scope="module")
def base_image(timings: dict[str, float]) -> str:
    """A Debian 12 base with python3 + venv, made by mmdebstrap and imported (both cached)."""
    buildah = _tool("buildah", "buildah")
    known = subprocess.run(
        [buildah, "inspect", "--type", "image", BASE_TAG], capture_output=True, check=False
    )
    if known.returncode == 0:
        return BASE_TAG
    tar = _cache() / "bookworm-python3.tar"
    if not tar.is_file():
        mmdebstrap = _tool("mmdebstrap", "mmdebstrap")
        tmp = tar.with_name(f".{os.getpid()}.{tar.name}")
        t0 = time.monotonic()
        # In a private mount namespace: mmdebstrap's root mode mounts /proc, /sys and the
        # host's /dev/shm into its chroot; if it were killed, those mounts would outlive it
        # (and a later `rm -rf` of its temp dir would reach through them). With unshare they
        # die with the process.
        _run(
            [
                _tool("unshare", "util-linux"),
                "--mount",
                "--propagation",
                "private",
                mmdebstrap,
                "--variant=minbase",
                "--format=tar",
                "--include=python3,python3-venv,passwd",
                "bookworm",
                str(tmp),
                *MIRRORS,
            ]
        )
        os.replace(tmp, tar)
        timings["mmdebstrap_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    _run([_tool("podman", "podman"), "import", str(tar), BASE_TAG])
    timings["import_s"] = time.monotonic() - t0
    return BASE_TAG


@pytest.fixture(scope="module")
def image(
    base_image: str, timings: dict[str, float], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """deploy/Containerfile built from scratch on the Debian base; removed afterwards."""
    buildah = _tool("buildah", "buildah")
    tag = f"localhost/vfio-dp-test:{os.getpid()}"
    host_build = tmp_path_factory.mktemp("host-build")
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", host_build / "ca.crt")
    (host_build / "pip.conf").write_text("[global]\ncert = /opt/host-build/ca.crt\n")
    t0 = time.monotonic()
    try:
        argv = [
            buildah, "bud",
            "--isolation", "chroot",
            "--network", "host",
            "-v", f"{host_build}:/opt/host-build:ro",
            "-v", f"{host_build / 'pip.conf'}:/etc/pip.conf:ro",
            "--build-arg", f"PYTHON_IMAGE={base_image}",
            "-f", "deploy/Containerfile",
            "-t", tag,
            ".",
        ]  # fmt: skip
        _run(argv, cwd=REPO)
        timings["build_s"] = time.monotonic() - t0
        print(f"\nimage timings (s): {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
        yield tag
    finally:
        subprocess.run([buildah, "rmi", "-f", tag], capture_output=True, check=False)


def _config(image: str) -> dict[str, Any]:
    buildah = _tool("buildah", "buildah")
    out = _run([buildah, "inspect", "--type", "image", image]).stdout
    config: dict[str, Any] = json.loads(out)["OCIv1"]["config"]
    return config


def _in_container(image: str, argv: list[str], volumes: dict[str, str] | None = None) -> str:
    """Run ``argv`` in a container of ``image``, as the image's USER (chroot isolation)."""
    buildah = _tool("buildah", "buildah")
    ctr = _run([buildah, "from", "--pull=never", image]).stdout.strip()
    try:
        vols = [a for h, c in (volumes or {}).items() for a in ("-v", f"{h}:{c}:ro")]
        return _run(
            [buildah, "run", "--isolation", "chroot", *vols, ctr, "--", *argv], timeout=300
        ).stdout
    finally:
        subprocess.run([buildah, "rm", ctr], capture_output=True, check=False)


def _vfioctl_in_image(image: str, args: list[str], volumes: dict[str, str] | None = None) -> str:
    """The image's ENTRYPOINT (``vfioctl``) with ``args``."""
    return _in_container(image, [*_config(image)["Entrypoint"], *args], volumes)


def test_image_runs_vfioctl_as_its_non_root_user(image: str) -> None:
    config = _config(image)
    assert config["Entrypoint"] == ["vfioctl"]
    assert config["User"] == "65532:65532"
    assert _in_container(image, ["id", "-u"]).strip() == "65532"


def test_vfioctl_help_in_the_image(image: str) -> None:
    out = _vfioctl_in_image(image, ["--help"])
    assert "Safe VFIO PCI passthrough" in out
    for cmd in ("list", "groups", "bind", "unbind", "check", "plugin", "webhook", "hostdev"):
        assert f"\n  {cmd} " in out, f"{cmd} missing from vfioctl --help in the image:\n{out}"


def test_vfioctl_list_in_the_image_matches_the_checkout(image: str, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    gpu_host(tree)
    for d in (tmp_path, tree):
        os.chmod(d, 0o755)  # the image's user (65532) reads the tree
    listed = json.loads(
        _vfioctl_in_image(image, ["list", "--root", "/tree", "-o", "json"], {str(tree): "/tree"})
    )
    checkout_vfioctl = [sys.executable, "-c", "from cli.main import main; main()"]
    here = json.loads(
        _run([*checkout_vfioctl, "list", "--root", str(tree), "-o", "json"], cwd=REPO).stdout
    )
    keys = ("address", "vendor", "device", "class", "driver", "iommu_group", "resource", "in_use")
    assert [{k: d[k] for k in keys} for d in listed] == [{k: d[k] for k in keys} for d in here]
    assert len(listed) > 5 and any(d["driver"] == "vfio-pci" for d in listed)
