"""deploy/Containerfile: multi-stage, installs the checkout with its libvirt extra, non-root."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.conftest import DEPLOY, REPO

CONTAINERFILE = DEPLOY / "Containerfile"


def _stages() -> list[list[str]]:
    """Instructions (continuation lines joined) grouped by FROM."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_multi_stage_with_build_tools_only_in_the_builder() -> None:
    stages = _stages()
    assert len(stages) >= 2
    builder, runtime = " ".join(stages[0]), " ".join(stages[-1])
    # the libvirt extra: hostdev --connect works in the image
    assert "libvirt-dev" in builder and 'pip install ".[libvirt]"' in builder
    assert "libvirt-dev" not in runtime and "build-essential" not in runtime
    assert re.search(r"\blibvirt0\b", runtime), "libvirt-python needs libvirt0 at run time"
    assert re.search(r"\bkmod\b", runtime), "the daemon runs modprobe vfio-pci"
    assert "COPY --from=builder" in runtime


def test_runs_as_non_root_by_default() -> None:
    users = [i.split()[1] for i in _stages()[-1] if i.upper().startswith("USER ")]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root UID (runAsNonRoot can verify it)"


def test_copies_exist_and_include_what_pip_install_reads() -> None:
    copied: set[str] = set()
    for stage in _stages():
        for instr in stage:
            parts = instr.split()
            if parts[0].upper() != "COPY" or any(p.startswith("--from") for p in parts):
                continue
            copied.update(p.rstrip("/") for p in parts[1:-1] if not p.startswith("--"))
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert needed <= copied, f"not copied into the build: {needed - copied}"
    missing = [p for p in sorted(copied) if not (REPO / p).exists()]
    assert not missing, f"COPY sources missing from the checkout (the build would fail): {missing}"


def test_the_image_has_the_pci_names_database() -> None:
    """Issue 38.4: without pci.ids `vfioctl list` in the image showed no device names.
    Debian's ``pci.ids`` package installs /usr/share/misc/pci.ids, the first place
    vfio_dp.host.pciids looks."""
    from vfio_dp.host.pciids import PCI_IDS_PATHS

    runtime = " ".join(_stages()[-1])
    installs = re.findall(r"apt-get install [^&]*", runtime)
    assert any(re.search(r"(?<![\w.-])pci\.ids(?![\w.-])", i) for i in installs), installs
    assert PCI_IDS_PATHS[0] == "/usr/share/misc/pci.ids"
