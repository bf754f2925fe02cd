"""One version (issue 38.1): pyproject's. ``vfioctl --version``, the image's label, the
manifests' image tag, the Vagrant VM's image and every versioned file name the docs show
agree with it; CHANGELOG.md is in Keep a Changelog form with an Unreleased section."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.docs_pages import PAGES

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_vfioctl_version_is_pyprojects() -> None:
    out = subprocess.run([sys.executable, "-c", "from cli.main import main; main()", "--version"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == VERSION, out.stdout


def test_the_image_label_is_pyprojects() -> None:
    text = (REPO / "deploy/Containerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", text, re.M) == [VERSION]
    assert 'org.opencontainers.image.version="${VERSION}"' in text
    # the build passes pyproject's value, read from the one place
    build = (REPO / "scripts/build-image.sh").read_text()
    assert '--build-arg "VERSION=$version"' in build and "pyproject.toml" in build
    assert set(re.findall(r"vfio-dp:(\d+\.\d+\.\d+)", text)) == {VERSION}


def test_the_manifests_run_pyprojects_version() -> None:
    for k in ("deploy/base/kustomization.yaml", "deploy/uninstall/kustomization.yaml"):
        (entry,) = yaml.safe_load((REPO / k).read_text())["images"]
        assert entry["newTag"] == VERSION, k
    provision = (REPO / "deploy/vagrant/provision.sh").read_text()
    assert re.findall(r"IMAGE=localhost/vfio-dp:(\S+)", provision) == [VERSION]


def test_every_version_the_docs_show_is_pyprojects() -> None:
    shown = {
        (doc.name, v)
        for doc in PAGES
        for v in re.findall(r"vfio[-_]dp[-_:](\d+\.\d+\.\d+)", doc.text)
    }
    assert shown and {v for _, v in shown} == {VERSION}, sorted(shown)


def test_the_changelog_keeps_a_changelog() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    versions = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert versions[0] == "Unreleased" and VERSION in versions
    for v in versions:
        assert re.search(rf"^\[{re.escape(v)}\]: \S+", text, re.M), f"no link for {v}"
    kinds = set(re.findall(r"^### (\w+)", text, re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds


def test_the_certificate_job_is_named_after_the_release() -> None:
    """A Job's pod template is immutable: re-applying the overlay with another template under
    the same name fails. Named after the release, one name has one template (its image is the
    release's), so applying again -- an upgrade included -- never hits that. The docs wait
    for it by the label its pods and it carry, which no release changes."""
    from tests.deploy.conftest import find, render

    objs = render(REPO / "deploy/overlays/self-signed")
    job = find(objs, "Job")
    assert job["metadata"]["name"] == f"vfio-dp-webhook-certs-{VERSION}"
    (ctr,) = job["spec"]["template"]["spec"]["containers"]
    assert ctr["image"].endswith(f":{VERSION}")
    label = "app.kubernetes.io/name=vfio-dp-webhook-certs"
    key, _, value = label.partition("=")
    assert job["metadata"]["labels"][key] == value
    waits = [
        line
        for doc in PAGES
        for line in doc.text.splitlines()
        if "wait --for=condition=complete job" in line
    ]
    assert waits and all(f"job -l {label}" in w for w in waits), waits
