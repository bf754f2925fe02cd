"""The README's image step reaches every overlay: the image is set in ONE place, the base.

Step 1 of "Install on a cluster" runs ``(cd deploy/base && kustomize edit set image
vfio-dp=REGISTRY/vfio-dp:TAG)``, which writes ``newName``/``newTag`` into the base's
``images:`` entry (kustomize itself is not installed here; the edit is made to the same
fields). Every installable overlay rendered by the real ``kubectl kustomize`` must then run
that image in every container -- before, the image was set only in the cert-manager overlay
and the self-signed route deployed the default.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, INSTALLABLE, all_of, render


@pytest.fixture(scope="module")
def deploy_with_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the self-signed overlay's certificates")
    root = tmp_path_factory.mktemp("image-setting") / "deploy"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("certs"))
    subprocess.run(
        [str(root / "overlays/self-signed/gen-certs.sh")], check=True, capture_output=True
    )
    kfile = root / "base/kustomization.yaml"
    data = yaml.safe_load(kfile.read_text())
    (entry,) = [i for i in data["images"] if i["name"] == "vfio-dp"]
    entry.update(newName="registry.example.com/team/vfio-dp", newTag="9.9.9")
    kfile.write_text(yaml.safe_dump(data, sort_keys=False))
    return root


@pytest.mark.parametrize("overlay", INSTALLABLE)
def test_every_overlay_runs_the_image_set_in_the_base(
    deploy_with_image: Path, overlay: str
) -> None:
    objs = render(deploy_with_image / overlay)
    images = [
        c["image"]
        for kind in ("DaemonSet", "Deployment")
        for o in all_of(objs, kind)
        for c in o["spec"]["template"]["spec"].get("containers", [])
        + o["spec"]["template"]["spec"].get("initContainers", [])
    ]
    assert len(images) >= 2
    assert set(images) == {"registry.example.com/team/vfio-dp:9.9.9"}, images


def test_no_overlay_sets_its_own_image() -> None:
    """One place: an `images:` entry in an overlay would silently win over the base's."""
    for overlay in INSTALLABLE:
        data = yaml.safe_load((DEPLOY / overlay / "kustomization.yaml").read_text())
        assert "images" not in data, overlay
