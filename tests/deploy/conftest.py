"""Fixtures: the kustomize base and every overlay, rendered by the real ``kubectl kustomize``.

The tree is rendered from a copy of exactly the files git tracks under ``deploy/`` — what a
fresh clone has: every overlay must render with nothing generated first (the self-signed
overlay makes its certificates in the cluster, with a Job).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
#: Every kustomization a user can apply or build on, relative to deploy/.
TARGETS = (
    "base",
    "overlays/cert-manager",
    "overlays/self-signed",
    "overlays/vagrant",
    "overlays/dra",
    "overlays/cert-manager-dra",
)
#: The ones that make a complete install (TLS and CA bundle included).
INSTALLABLE = (
    "overlays/cert-manager",
    "overlays/self-signed",
    "overlays/vagrant",
    "overlays/dra",
    "overlays/cert-manager-dra",
)

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not on PATH: these tests render the manifests with it")
    return path


def fresh_copy(dest: Path) -> Path:
    """Copy the git-tracked files under deploy/ (a fresh clone's) to ``dest``/deploy."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "deploy"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    root = dest / "deploy"
    for rel in filter(None, listed):
        src, dst = REPO / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        else:
            shutil.copy2(src, dst)
    return root


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_copy(tmp_path_factory.mktemp("deploy"))


def render(directory: Path) -> list[Obj]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d is not None]


@pytest.fixture(scope="session")
def rendered(deploy_copy: Path) -> dict[str, list[Obj]]:
    return {target: render(deploy_copy / target) for target in TARGETS}


def find(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    hits = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, found {len(hits)}"
    return hits[0]


def all_of(objs: list[Obj], kind: str) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] == kind)
