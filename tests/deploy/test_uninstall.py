"""deploy/uninstall: the one-shot workload that gives every device back on every node.

Rendered by the real kubectl from a fresh copy, every object strictly valid; the init
container's command is the real `vfioctl unbind --all` with the host mounts it needs (the
same host paths as the daemon's); that command, run on a temp tree with the root swapped,
lists each device's way back, and refuses while a daemon of ours holds its lock.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import Obj, find, render
from tests.deploy.helpers import command, parse_cli_args, volume_for_path
from tests.deploy.k8s_schema import check_object
from tests.sysfs_tree import Dev, SysfsTree

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
#: what unbind reads or writes under its root, and whether it writes there
MOUNTS = (("sys", "/sys", True), ("dev", "/dev", False), ("proc", "/proc", False),
          ("var/lib/vfio_dp", "/var/lib/vfio_dp", True), ("run/vfio_dp", "/run/vfio_dp", True))  # fmt: skip


@pytest.fixture(scope="module")
def objs(deploy_copy: Path) -> list[Obj]:
    return render(deploy_copy / "uninstall")


def _init(objs: list[Obj]) -> tuple[Obj, Obj]:
    ds = find(objs, "DaemonSet", "vfio-dp-uninstall")
    spec = ds["spec"]["template"]["spec"]
    (ctr,) = spec["initContainers"]
    return spec, ctr


def test_valid_and_runs_the_installs_image(objs: list[Obj], deploy_copy: Path) -> None:
    for o in objs:
        assert check_object(o) == [], o["kind"]
    base = yaml.safe_load((deploy_copy / "base/kustomization.yaml").read_text())
    (img,) = [i for i in base["images"] if i["name"] == "vfio-dp"]
    spec, ctr = _init(objs)
    want = f"{img['newName']}:{img['newTag']}"
    assert ctr["image"] == want and spec["containers"][0]["image"] == want
    assert spec["nodeSelector"]["vfio.kubevirt.io/enabled"] == "true"


def test_the_init_container_is_unbind_all_with_the_host_mounts(objs: list[Obj]) -> None:
    spec, ctr = _init(objs)
    assert ctr["command"] == ["vfioctl"] and ctr["args"][:2] == ["unbind", "--all"]
    given = parse_cli_args(command("cli.host_cmds", "unbind_cmd"), ctr["args"][1:])
    assert given["every"] is True and "force" not in given
    root = given["root"]
    for sub, host, writable in MOUNTS:
        mount, volume = volume_for_path(spec, ctr, posixpath.join(root, sub))
        assert volume["hostPath"]["path"] == host
        assert bool(mount.get("readOnly")) is not writable, sub


def test_its_command_on_a_temp_tree(objs: list[Obj], tmp_path: Path) -> None:
    _, ctr = _init(objs)
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:65:00.0", "8086", "10d3", "020000", driver="vfio-pci", group=7))
    t.ensure_driver("e1000e")
    state = tmp_path / "var/lib/vfio_dp/original"
    state.mkdir(parents=True)
    (state / "0000:65:00.0.json").write_text(json.dumps(
        {"address": "0000:65:00.0", "driver": "e1000e", "driver_override": None,
         "vendor": "8086", "device": "10d3"}))  # fmt: skip
    args = [str(tmp_path) if a == "/host" else a for a in ctr["args"]]
    out = subprocess.run([*VFIOCTL, *args, "--dry-run"], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# 0000:65:00.0: back to e1000e")
    # the scenario: another process holds the lock until killed ("held" says when it has it)
    hold = ("import sys,time; from vfio_dp.host.instance import InstanceLock, lock_name; "
            "from vfio_dp.host.root import Root; "
            "InstanceLock(Root(sys.argv[1]), lock_name('device-plugin')).acquire(0); "
            "print('held', flush=True); time.sleep(60)")  # fmt: skip
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = subprocess.run(
            [*VFIOCTL, *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert refused.returncode == 1 and "runs on this node" in refused.stderr
        assert (state / "0000:65:00.0.json").exists()
    finally:
        holder.kill()
        holder.communicate(timeout=10)


def test_every_object_of_every_install_carries_the_part_of_label(
    rendered: dict[str, list[Obj]],
) -> None:
    """The uninstall steps select by it (e.g. `kubectl delete deviceclass -l ...`)."""
    from tests.deploy.conftest import INSTALLABLE

    for target in INSTALLABLE:
        bare = [
            f"{o['kind']}/{o['metadata']['name']}"
            for o in rendered[target]
            if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") != "vfio-dp"
        ]
        assert bare == [], target


def _bare(objs: list[Obj]) -> list[str]:
    return [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in objs
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") != "vfio-dp"
    ]


def test_the_examples_and_the_uninstall_workload_carry_the_label_too(
    deploy_copy: Path, objs: list[Obj]
) -> None:
    """Issue 38.4: the examples' DeviceClasses had no labels, so the uninstall's
    `kubectl delete deviceclass -l app.kubernetes.io/part-of=vfio-dp` left them."""
    examples = render(deploy_copy / "examples/dra")
    assert _bare(examples) == []
    assert _bare(objs) == []


def test_the_examples_make_the_namespace_they_use(deploy_copy: Path) -> None:
    """Issue 38.4: `kubectl apply -k deploy/examples/dra` failed: namespace vms was never made."""
    examples = render(deploy_copy / "examples/dra")
    made = {o["metadata"]["name"] for o in examples if o["kind"] == "Namespace"}
    used = {o["metadata"]["namespace"] for o in examples if "namespace" in o["metadata"]}
    vmi = yaml.safe_load((deploy_copy / "examples/dra/vmi.yaml").read_text())
    assert used | {vmi["metadata"]["namespace"]} <= made == {"vms"}


def test_generated_device_classes_carry_the_label(tmp_path: Path) -> None:
    """`vfioctl deviceclasses | kubectl apply -f -` makes classes the uninstall finds."""
    config = tmp_path / "config.yaml"
    config.write_text("selectors:\n  - vendor: '10de'\n    device: '1eb8'\n    path: dra\n")
    out = subprocess.run([*VFIOCTL, "deviceclasses", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    classes = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert classes and _bare(classes) == []


def test_the_uninstall_steps_can_run_twice() -> None:
    """Every `kubectl delete` of the uninstall steps after the first object is gone (step 1
    deletes the webhook configuration, which step 4's `delete -k` of the overlay names again)
    passes --ignore-not-found, so a step re-run or a half-done uninstall never fails."""
    from tests.deploy.conftest import REPO

    text = (REPO / "docs/install.md").read_text()
    section = text.split("## Uninstall", 1)[1].split("\n## ", 1)[0]
    deletes = [
        line.strip() for line in section.splitlines() if line.strip().startswith("kubectl delete")
    ]
    assert len(deletes) >= 4, deletes
    assert [d for d in deletes if "--ignore-not-found" not in d] == []
