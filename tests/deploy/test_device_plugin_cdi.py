"""``deploy/components/device-plugin-cdi``: the device-plugin daemon with ``--cdi-dir``.

Rendered in an overlay over the self-signed install: the flag exists in the real ``plugin``
command, its directory is the host's ``/var/run/cdi`` mounted read-write at the same path
(never under ``--root``: the runtime reads the spec paths as host paths), and every object is
still valid against the client's models. Without the component no install turns CDI on.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from tests.deploy.conftest import TARGETS, Obj, find, render
from tests.deploy.helpers import command, container, parse_cli_args, volume_for_path
from tests.deploy.k8s_schema import check_object, deserialize_errors


def _daemon(objs: list[Obj]) -> tuple[Obj, Obj, dict[str, object]]:
    spec = find(objs, "DaemonSet", "vfio-dp-daemon")["spec"]["template"]["spec"]
    ctr = container(spec, "daemon")
    assert ctr["args"][0] == "plugin"
    return spec, ctr, parse_cli_args(command("cli.deviceplugin_cmd", "plugin"), ctr["args"][1:])


def test_the_component_turns_cdi_on_with_the_hosts_cdi_dir(deploy_copy: Path) -> None:
    overlay = deploy_copy / "overlays/cdi-test"
    overlay.mkdir(exist_ok=True)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../self-signed]\ncomponents: [../../components/device-plugin-cdi]\n"
    )
    objs = render(overlay)
    problems = [f"{o['kind']}: {p}" for o in objs for p in check_object(o)]
    problems += [e for o in objs for e in deserialize_errors(o)]
    assert not problems, problems
    spec, ctr, given = _daemon(objs)
    path = given["cdi_dir"]
    assert path == "/var/run/cdi"
    root = str(given["root"])
    assert not str(path).startswith(root.rstrip("/") + "/"), "--cdi-dir is never under --root"
    mount, volume = volume_for_path(spec, ctr, str(path))
    assert volume["hostPath"]["path"] == posixpath.normpath(str(path))
    assert not mount.get("readOnly")


def test_no_shipped_install_turns_cdi_on_by_itself(rendered: dict[str, list[Obj]]) -> None:
    for target in TARGETS:
        _, _, given = _daemon(rendered[target])
        assert given.get("cdi_dir") is None, target
