"""The README's image step reaches every overlay: the image is set in ONE place, the base.

Step 1 of "Install on a cluster" runs ``(cd deploy/base && kustomize edit set image
vfio-dp=REGISTRY/vfio-dp:TAG)``, which writes ``newName``/``newTag`` into the base's
``images:`` entry (kustomize itself is not installed here; the edit is made to the same
fields). Every installable overlay rendered by the real ``kubectl kustomize`` must then run
that image in every container -- before, the image was set only in the cert-manager overlay
and the self-signed route deployed the default.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, INSTALLABLE, all_of, fresh_copy, render


@pytest.fixture(scope="module")
def deploy_with_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = fresh_copy(tmp_path_factory.mktemp("image-setting"))
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
    pod_specs = [
        o["spec"]["template"]["spec"]
        for kind in ("DaemonSet", "Deployment", "Job")
        for o in all_of(objs, kind)
    ] + [o["spec"]["jobTemplate"]["spec"]["template"]["spec"] for o in all_of(objs, "CronJob")]
    images = [
        c["image"]
        for spec in pod_specs
        for c in spec.get("containers", []) + spec.get("initContainers", [])
    ]
    assert len(images) >= 2
    assert set(images) == {"registry.example.com/team/vfio-dp:9.9.9"}, images


def test_no_overlay_sets_its_own_image() -> None:
    """One place: an `images:` entry in an overlay would silently win over the base's."""
    for overlay in INSTALLABLE:
        data = yaml.safe_load((DEPLOY / overlay / "kustomization.yaml").read_text())
        assert "images" not in data, overlay


def test_the_operators_own_overlay_from_the_install_page_sets_every_image(
    tmp_path: Path,
) -> None:
    """docs/install.md's `my-site` overlay, next to a fresh copy of the checkout, renders with
    the operator's registry in every container (Job and CronJob included)."""
    import re

    text = (DEPLOY.parent / "docs/install.md").read_text()
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "my-site/kustomization.yaml" in b
    ]
    fresh_copy(tmp_path / "vfio-dp")
    site = tmp_path / "my-site"
    site.mkdir()
    (site / "kustomization.yaml").write_text(block.replace("REGISTRY", "registry.example.com/team"))
    objs = render(site)
    specs = [
        o["spec"]["template"]["spec"]
        for k in ("DaemonSet", "Deployment", "Job")
        for o in all_of(objs, k)
    ]
    specs += [o["spec"]["jobTemplate"]["spec"]["template"]["spec"] for o in all_of(objs, "CronJob")]
    images = {
        c["image"] for s in specs for c in s.get("containers", []) + s.get("initContainers", [])
    }
    assert images == {"registry.example.com/team/vfio-dp:0.1.0"}, images
