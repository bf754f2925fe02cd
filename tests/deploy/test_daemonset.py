"""The DaemonSet runs `vfioctl plugin` with flags that exist and mounts what the daemon reads."""

from __future__ import annotations

import posixpath
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import INSTALLABLE, TARGETS, Obj, all_of, find
from tests.deploy.helpers import (
    check_envvars,
    command,
    container,
    container_port,
    parse_cli_args,
    volume_for_path,
)

#: What the daemon reads below --root, as (path under the root, host path, writable?).
ROOT_MOUNTS = (
    ("sys", "/sys", True),  # discovery + driver_override/unbind/drivers_probe writes
    ("dev", "/dev", False),  # existence of /dev/vfio/<N>, /dev/vfio/devices/vfioN, /dev/iommu
    ("proc", "/proc", False),  # /proc/1/mountinfo, /proc/swaps
    ("var/lib/vfio_dp", "/var/lib/vfio_dp", True),  # persisted state (original drivers)
    ("run/vfio_dp", "/run/vfio_dp", True),  # runtime state
    ("lib/modules", "/lib/modules", False),  # `modprobe -d <root> vfio-pci`
)


@pytest.fixture(scope="module")
def plugin_cmd() -> object:
    return command("cli.deviceplugin_cmd", "plugin")


def _daemon(objs: list[Obj]) -> tuple[Obj, Obj, Obj]:
    ds = find(objs, "DaemonSet", "vfio-dp-daemon")
    spec = ds["spec"]["template"]["spec"]
    return ds, spec, container(spec, "daemon")


@pytest.mark.parametrize("target", TARGETS)
def test_flags_exist_and_mounts_match(
    rendered: dict[str, list[Obj]], target: str, plugin_cmd: object
) -> None:
    import click

    assert isinstance(plugin_cmd, click.Command)
    objs = rendered[target]
    ds, spec, ctr = _daemon(objs)
    assert ctr["command"] == ["vfioctl"]
    assert ctr["args"][0] == "plugin"
    given = parse_cli_args(plugin_cmd, ctr["args"][1:])
    check_envvars(plugin_cmd, ctr.get("env", []))
    for p in plugin_cmd.params:
        if p.required:
            assert p.name in given, f"required option {p.name} not given"

    # --root: every host tree the daemon reads is mounted below it, from the same host path.
    root = given["root"]
    assert root.startswith("/") and root != "/", "the daemon must see the host through a mount"
    for sub, host, writable in ROOT_MOUNTS:
        mount, volume = volume_for_path(spec, ctr, posixpath.join(root, sub))
        assert volume.get("hostPath", {}).get("path") == host, f"{root}/{sub} must be host {host}"
        assert bool(mount.get("readOnly")) is not writable, (
            f"{root}/{sub} must be {'read-write' if writable else 'read-only'}"
        )
        assert not mount.get("subPath"), f"{root}/{sub}: no subPath"

    # --kubelet-dir: the kubelet's own path, mounted at the same path, never under --root.
    kdir = given.get("kubelet_dir", "/var/lib/kubelet/device-plugins")
    assert not kdir.startswith(root.rstrip("/") + "/"), "--kubelet-dir is never joined with --root"
    mount, volume = volume_for_path(spec, ctr, kdir)
    assert volume["hostPath"]["path"] == kdir
    assert not mount.get("readOnly"), "the daemon creates its sockets there"
    # PodResources API socket (read-only mount: connecting to a unix socket still works).
    prdir = posixpath.join(posixpath.dirname(kdir), "pod-resources")
    mount, volume = volume_for_path(spec, ctr, prdir)
    assert volume["hostPath"]["path"] == prdir and mount.get("readOnly") is True

    # --config: a ConfigMap directory mount (no subPath, so updates arrive), key present,
    # and the content is a config the daemon accepts.
    cfg = given["config_path"]
    mount, volume = volume_for_path(spec, ctr, posixpath.dirname(cfg))
    assert "configMap" in volume and not mount.get("subPath")
    cm = find(objs, "ConfigMap", volume["configMap"]["name"])
    key = posixpath.basename(cfg)
    assert key in cm["data"], f"ConfigMap {cm['metadata']['name']} has no key {key}"
    from vfio_dp.model.config import parse_config

    parse_config(yaml.safe_load(cm["data"][key]), f"{target}:{key}")

    # --metrics-port: exposed, probed at /healthz, and annotated for Prometheus.
    port = given.get("metrics_port", 9109)
    assert port in [p["containerPort"] for p in ctr["ports"]]
    for probe in ("livenessProbe", "readinessProbe"):
        get = ctr[probe]["httpGet"]
        assert get["path"] == "/healthz" and container_port(ctr, get["port"]) == port
        assert get.get("scheme", "HTTP") == "HTTP"
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == str(port)


@pytest.mark.parametrize("target", TARGETS)
def test_host_access_is_what_the_daemon_needs(rendered: dict[str, list[Obj]], target: str) -> None:
    objs = rendered[target]
    _, spec, ctr = _daemon(objs)
    assert spec["hostNetwork"] is True  # kernel uevents reach the host netns only
    assert not spec.get("hostPID") and not spec.get("hostIPC")
    assert ctr["securityContext"]["privileged"] is True  # sysfs writes, modprobe
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"]["vfio.kubevirt.io/enabled"] == "true"
    assert spec.get("terminationGracePeriodSeconds", 30) >= 10  # empty list + socket cleanup
    res = ctr["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
    # The daemon needs no API access: no token, and nothing grants its ServiceAccount anything.
    sa = spec["serviceAccountName"]
    assert spec["automountServiceAccountToken"] is False
    for binding in (*all_of(objs, "RoleBinding"), *all_of(objs, "ClusterRoleBinding")):
        for subject in binding.get("subjects", []):
            assert subject["name"] != sa, f"{binding['metadata']['name']} grants the daemon access"
    # Every hostPath is one the daemon reads (nothing extra from the host).
    allowed = {host for _, host, _ in ROOT_MOUNTS} | {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
    }
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths <= allowed, host_paths - allowed


READ_COMMANDS = ("list", "groups", "check")


@pytest.mark.parametrize("target", INSTALLABLE)
def test_kubectl_exec_sees_the_host_without_flags(
    rendered: dict[str, list[Obj]], target: str
) -> None:
    """`kubectl exec POD -- vfioctl list` inherits the container's environment: in every
    DaemonSet of ours the read commands resolve --root and --config to what the running
    process was given, and a rolling update never runs two of ours on one node."""
    import click

    from cli.main import vfioctl

    daemonsets = list(all_of(rendered[target], "DaemonSet"))
    assert {d["metadata"]["name"] for d in daemonsets} >= {"vfio-dp-daemon"}
    for ds in daemonsets:
        assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        (ctr,) = ds["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in ctr.get("env", []) if "value" in e}
        own = parse_cli_args(command(*_COMMANDS[ctr["args"][0]]), ctr["args"][1:])
        assert env["VFIOCTL_ROOT"] == own["root"]
        assert env["VFIOCTL_CONFIG"] == own["config_path"]
    for name in READ_COMMANDS:
        cmd = vfioctl.get_command(click.Context(vfioctl), name)
        assert cmd is not None
        envvars = {p.name: p.envvar for p in cmd.params if isinstance(p, click.Option)}
        assert envvars["root"] == "VFIOCTL_ROOT", name
        if name != "check":
            assert envvars["config"] == "VFIOCTL_CONFIG", name


_COMMANDS = {
    "plugin": ("cli.deviceplugin_cmd", "plugin"),
    "dra-plugin": ("cli.dra_cmd", "dra_plugin"),
}


def test_root_from_the_environment_is_what_list_reads(tmp_path: Path) -> None:
    """The env var alone (as in the pod) points `vfioctl list` at another root."""
    import json
    import os
    import subprocess
    import sys

    from tests.sysfs_tree import Dev, SysfsTree

    SysfsTree(tmp_path).add(
        Dev("0000:65:00.0", "8086", "10d3", "020000", driver="vfio-pci", group=7)
    )
    env = {**os.environ, "VFIOCTL_ROOT": str(tmp_path)}
    env.pop("VFIOCTL_CONFIG", None)
    out = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "list", "-o", "json"],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    (dev,) = json.loads(out.stdout)
    assert dev["address"] == "0000:65:00.0" and dev["driver"] == "vfio-pci"
