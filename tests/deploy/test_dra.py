"""The DRA manifests: the DaemonSet runs `vfioctl dra-plugin` with flags that exist and mounts
what it needs; the DeviceClasses' CEL selects exactly the devices the plugin publishes (the
expressions are evaluated with cel-python against devices built by the real slice builder);
the examples are valid against the kubernetes client's models."""

from __future__ import annotations

import posixpath
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, TARGETS, Obj, find, kubectl
from tests.deploy.helpers import (
    check_envvars,
    command,
    container,
    container_port,
    parse_cli_args,
    volume_for_path,
)
from tests.deploy.k8s_schema import check_object, deserialize_errors
from tests.deploy.test_daemonset import ROOT_MOUNTS
from tests.dra.cel_view import cel
from tests.dra.topologies import dra_host
from vfio_dp.dra.deviceclasses import kind_guard, mdev_device_class
from vfio_dp.dra.slices import published_devices
from vfio_dp.host import Host
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.config import PATHS, parse_config

TARGET = "overlays/dra"


@pytest.fixture(scope="module")
def examples() -> list[Obj]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "examples/dra")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _plugin(objs: list[Obj]) -> tuple[Obj, Obj, Obj]:
    ds = find(objs, "DaemonSet", "vfio-dp-dra")
    spec = ds["spec"]["template"]["spec"]
    return ds, spec, container(spec, "dra-plugin")


def test_flags_exist_and_mounts_match(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered[TARGET]
    cmd = command("cli.dra_cmd", "dra_plugin")
    ds, spec, ctr = _plugin(objs)
    assert ctr["command"] == ["vfioctl"] and ctr["args"][0] == "dra-plugin"
    given = parse_cli_args(cmd, ctr["args"][1:])
    check_envvars(cmd, ctr.get("env", []))
    root = given["root"]
    for sub, host, writable in ROOT_MOUNTS:
        mount, volume = volume_for_path(spec, ctr, posixpath.join(root, sub))
        assert volume["hostPath"]["path"] == host
        assert bool(mount.get("readOnly")) is not writable, f"{root}/{sub}"
    # kubelet and CDI dirs: the host's own paths, mounted read-write, never under --root
    for opt in ("kubelet_registry_dir", "kubelet_plugins_dir", "cdi_dir"):
        path = given[opt]
        assert not path.startswith(root.rstrip("/") + "/"), f"--{opt} is never joined with --root"
        mount, volume = volume_for_path(spec, ctr, path)
        assert volume["hostPath"]["path"] == path and not mount.get("readOnly"), opt
    # the node's name from the downward API (the option's second env var)
    env = {e["name"]: e for e in ctr["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    node_opt = next(p for p in cmd.params if p.name == "node_name")
    assert "NODE_NAME" in (node_opt.envvar or [])
    # the config: the same ConfigMap as the daemon, every selector with an explicit path
    cfg = given["config_path"]
    mount, volume = volume_for_path(spec, ctr, posixpath.dirname(cfg))
    cm = find(objs, "ConfigMap", volume["configMap"]["name"])
    raw = yaml.safe_load(cm["data"][posixpath.basename(cfg)])
    parsed = parse_config(raw, "overlays/dra:config.yaml")
    assert all(sel.get("path") in PATHS for sel in raw["selectors"]), "every selector has a path"
    assert {s.path for s in parsed.selectors} == set(PATHS)
    # metrics: 9110 (the daemon holds 9109 on the same host network), probed at /healthz
    port = given["metrics_port"]
    assert port == 9110 and port in [p["containerPort"] for p in ctr["ports"]]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container_port(ctr, ctr[probe]["httpGet"]["port"]) == port
    assert ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert spec["hostNetwork"] is True and ctr["securityContext"]["privileged"] is True


def test_rbac_is_exactly_what_the_plugin_calls(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered[TARGET]
    _, spec, _ = _plugin(objs)
    assert spec["automountServiceAccountToken"] is True  # it writes ResourceSlices
    binding = find(objs, "ClusterRoleBinding", "vfio-dp-dra")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": "vfio-dp"}
    ]
    rules = find(objs, "ClusterRole", binding["roleRef"]["name"])["rules"]
    granted = {
        (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip
    # what vfio_dp/dra/apiserver/publisher.py calls (its docstring lists them), plus claims for
    # Prepare and the claim watch (vfio_dp/dra/apiserver/claim_watch.py: list, watch);
    # test_dra_policy.py derives the same set from the publisher's real requests
    needed = {
        ("", "nodes", "get"),
        *(
            ("resource.k8s.io", "resourceslices", v)
            for v in ("list", "watch", "create", "update", "delete")
        ),
        *(("resource.k8s.io", "resourceclaims", v) for v in ("get", "list", "watch")),
        ("resource.k8s.io", "deviceclasses", "get"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"),
    }
    assert needed == granted, granted ^ needed
    assert not any(r in ("secrets", "pods", "*") or v == "*" for _, r, v in granted)


def _cel(expression: str) -> Any:
    celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return lambda device: bool(program.evaluate({"device": celpy.json_to_cel(device)}))


def _cel_devices(driver: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The devices the plugin publishes on the DRA test topology, in CEL's view: attributes
    grouped by domain (bare names are in the driver's), values unwrapped."""
    tree = dra_host(tmp_path)
    host = Host(tree.root)
    inv = host.scan()
    raw = yaml.safe_load((DEPLOY / "components/dra/config.yaml").read_text())
    raw["selectors"] = [
        {"vendor": "15b3", "device": "101c", "path": "dra"},
        {"class": "0108", "path": "dra"},
        {"vendor": "10de", "path": "dra", "bind": "onPrepare"},
    ]
    out = []
    for d in published_devices(inv, parse_config(raw), pcie_roots(host.fs, inv.devices)):
        attrs: dict[str, dict[str, object]] = {}
        for name, value in d.to_json()["attributes"].items():
            domain, _, ident = name.rpartition("/")
            attrs.setdefault(domain or driver, {})[ident] = next(iter(value.values()))
        out.append({"driver": driver, "name": d.name, "attributes": attrs})
    return out


def test_device_classes_select_exactly_the_intended_devices(
    rendered: dict[str, list[Obj]], examples: list[Obj], tmp_path: Path
) -> None:
    objs = rendered[TARGET]
    _, _, ctr = _plugin(objs)
    driver = parse_cli_args(command("cli.dra_cmd", "dra_plugin"), ctr["args"][1:])["driver_name"]
    devices = _cel_devices(driver, tmp_path)
    assert len(devices) == 4

    def selected(dc: Obj) -> set[str]:
        checks = [_cel(s["cel"]["expression"]) for s in dc["spec"]["selectors"]]
        return {d["name"] for d in devices if all(c(d) for c in checks)}

    main = find(objs, "DeviceClass", driver)  # named after the driver
    guard = f'device.driver == "{driver}" && {kind_guard(driver)}'
    assert main["spec"]["selectors"] == [{"cel": {"expression": guard}}]
    assert "namespace" not in main["metadata"]  # cluster-scoped
    assert selected(main) == {d["name"] for d in devices}
    other = {**devices[0], "driver": "gpu.nvidia.com"}  # another driver's device
    assert not _cel(main["spec"]["selectors"][0]["cel"]["expression"])(other)
    by_class = {
        dc["metadata"]["name"]: selected(dc) for dc in examples if dc["kind"] == "DeviceClass"
    }
    assert by_class == {
        "vfio-nvidia-t4.vfio.dra.vfio-dp.io": {"pci-0000-3b-00-0"},
        "vfio-intel-82574l.vfio.dra.vfio-dp.io": set(),  # a device-plugin NIC here
        "vfio-mellanox-cx5-vf.vfio.dra.vfio-dp.io": {"pci-0000-af-00-1", "pci-0000-af-00-2"},
        "vfio-samsung-nvme.vfio.dra.vfio-dp.io": {"pci-0000-07-00-0"},
        "nvidia-222.mdev.vfio.dra.vfio-dp.io": set(),  # no mdev entries in this pool
    }
    # a group's container entry (kind: native, no vendorID) is selected by none of them, and
    # evaluating them on it is no CEL error (the guard comes first)
    native = {
        "driver": driver,
        "name": "pci-0000-07-00-0-native",
        "attributes": {driver: {"kind": "native", "iommuGroup": 9}},
    }
    for dc in [main, *(dc for dc in examples if dc["kind"] == "DeviceClass")]:
        assert not cel(dc["spec"]["selectors"][0]["cel"]["expression"])(native)  # no error
    # an mdev entry (kind: mdev, the parent's pciBusID, no vendorID) only by the mdev class
    mdev = {
        "driver": driver,
        "name": "mdev-0000-3b-00-0-nvidia-222-0",
        "attributes": {
            driver: {"kind": "mdev", "mdevType": "nvidia-222", "mdevParent": "0000:3b:00.0"},
            "resource.kubernetes.io": {"pciBusID": "0000:3b:00.0"},
        },
    }
    picks = {
        dc["metadata"]["name"]
        for dc in [main, *(dc for dc in examples if dc["kind"] == "DeviceClass")]
        if cel(dc["spec"]["selectors"][0]["cel"]["expression"])(mdev)  # no error either
    }
    assert picks == {"nvidia-222.mdev.vfio.dra.vfio-dp.io"}
    assert (
        mdev_device_class(driver, "nvidia-222")["spec"]
        == find(examples, "DeviceClass", "nvidia-222.mdev.vfio.dra.vfio-dp.io")["spec"]
    )  # the example is what vfioctl deviceclasses prints


def test_examples_are_valid_and_the_template_names_an_example_class(examples: list[Obj]) -> None:
    problems = [
        f"{o['kind']}/{o['metadata']['name']}: {p}" for o in examples for p in check_object(o)
    ]
    problems += [e for o in examples for e in deserialize_errors(o)]
    assert not problems, "\n".join(problems)
    classes = {o["metadata"]["name"] for o in examples if o["kind"] == "DeviceClass"}
    (tmpl,) = [o for o in examples if o["kind"] == "ResourceClaimTemplate"]
    for req in tmpl["spec"]["spec"]["devices"]["requests"]:
        assert req["exactly"]["deviceClassName"] in classes
        assert req["exactly"]["count"] == 1


@pytest.mark.parametrize("target", TARGETS)
def test_every_shipped_config_assigns_a_path_to_every_selector(
    rendered: dict[str, list[Obj]], target: str
) -> None:
    """Without paths both node processes would serve the same vfio-pci devices."""
    cm = find(rendered[target], "ConfigMap", "vfio-dp-config")
    raw = yaml.safe_load(cm["data"]["config.yaml"])
    parse_config(raw, f"{target}:config.yaml")
    assert raw["selectors"] and all(sel.get("path") in PATHS for sel in raw["selectors"])
