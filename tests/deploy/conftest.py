"""Fixtures: the kustomize base and every overlay, rendered by the real ``kubectl kustomize``.

The tree is copied to a temp dir first and the self-signed overlay's certificates are made
there with its own ``gen-certs.sh`` (the checkout's ``certs/`` is never read or written).
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
)
#: The ones that make a complete install (TLS and CA bundle included).
INSTALLABLE = (
    "overlays/cert-manager",
    "overlays/self-signed",
    "overlays/vagrant",
    "overlays/dra",
)

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not on PATH: these tests render the manifests with it")
    return path


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the self-signed overlay's certificates")
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("certs"))
    subprocess.run(
        [str(root / "overlays/self-signed/gen-certs.sh")], check=True, capture_output=True
    )
    return root


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
