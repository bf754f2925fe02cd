"""The operator's image command works end to end (minutes: marked ``image``).

``scripts/build-image.sh --debian-base`` builds deploy/Containerfile and writes ONE OCI
archive, as an operator does to get the image onto nodes without a registry; the archive is
then loaded into a real container runtime (``podman load``) and the tests run the LOADED
image. No container registry can be reached from the machines this runs on (only Debian's and
PyPI's package archives), so the base is made from Debian's packages: ``mmdebstrap`` writes a
Debian 12 root file system with ``python3`` and ``python3-venv`` (what the official
``python:3.11-slim-bookworm`` default provides), imported with podman, then
``--build-arg PYTHON_IMAGE=<that image>`` -- the same Containerfile users build. The base is
cached under ``$VFIO_DP_CACHE/image`` (default ``~/.cache/vfio_dp/image``); the project
image is built from scratch every time and removed afterwards.

Build isolation is ``chroot``: in these machines' containers the OCI runtime (crun) may not
set the container's rlimits (``setrlimit RLIMIT_NOFILE: Operation not permitted``). The build
mounts the host's CA bundle and a two-line pip.conf pointing at it into its RUN steps only,
so pip trusts a TLS-intercepting proxy where there is one; nothing of it lands in the image.

Then, in the loaded image, with its own ENTRYPOINT and USER (65532): ``vfioctl --version``,
``vfioctl --help`` and
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


@pytest.fixture(scope="module")
def timings() -> dict[str, float]:
    return {}


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory, timings: dict[str, float]) -> Path:
    """The operator's command: scripts/build-image.sh on a Debian base made from Debian's
    packages (--debian-base: no registry), writing ONE OCI archive; the built image is
    removed from local storage (the archive is the product)."""
    _tool("buildah", "buildah"), _tool("podman", "podman"), _tool("mmdebstrap", "mmdebstrap")
    out = tmp_path_factory.mktemp("archive") / "vfio-dp.oci.tar"
    tag = f"localhost/vfio-dp-test:{os.getpid()}"
    t0 = time.monotonic()
    proc = _run(
        ["bash", "scripts/build-image.sh", "--debian-base", "--tag", tag, "--out", str(out)],
        cwd=REPO,
    )
    timings["build_s"] = time.monotonic() - t0
    path, named, size, unit = proc.stdout.strip().splitlines()[-1].split()
    assert Path(path) == out and named == tag and unit == "MiB"
    assert round(out.stat().st_size / (1 << 20)) == int(size)
    timings["archive_mib"] = float(size)
    gone = subprocess.run(
        [_tool("buildah", "buildah"), "inspect", "--type", "image", tag],
        capture_output=True,
        check=False,
    )
    assert gone.returncode != 0, "the script leaves only the archive (no --keep)"
    return out


@pytest.fixture(scope="module")
def image(archive: Path, timings: dict[str, float]) -> Iterator[str]:
    """The archive loaded into a real container runtime (podman), as a node would load it."""
    podman = _tool("podman", "podman")
    t0 = time.monotonic()
    loaded = _run([podman, "load", "-i", str(archive)]).stdout
    timings["load_s"] = time.monotonic() - t0
    tag = f"localhost/vfio-dp-test:{os.getpid()}"
    assert tag in loaded, loaded
    print(f"\nimage timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    try:
        yield tag
    finally:
        subprocess.run([podman, "rmi", "-f", tag], capture_output=True, check=False)


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


def test_vfioctl_version_in_the_loaded_image_is_the_checkouts(image: str) -> None:
    from importlib.metadata import version

    out = _vfioctl_in_image(image, ["--version"])
    assert out.strip() == f"vfioctl, version {version('vfio-dp')}"


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
