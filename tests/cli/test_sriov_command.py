"""``vfioctl sriov``, ``vfioctl sriov set`` and ``unbind --all``'s SR-IOV part as a user runs
them: real processes on temp trees, dry runs and refusals only (the writes themselves are
tested with the kernel simulator in tests/host/test_sriov.py and on the real kernel in the
guest)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.cli.test_host_commands import run
from tests.sysfs_tree import Dev, SysfsTree

PF = "0000:01:00.0"
MLX = "0000:af:00.0"  # gpu_host: 2 VFs made by someone else, VF groups 61 and 62


def nvme(tree: SysfsTree) -> SysfsTree:
    tree.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    tree.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
                 sriov_totalvfs=2, sriov_numvfs=0))  # fmt: skip
    return tree


def test_list_json(tree: SysfsTree, tmp_path: Path) -> None:
    nvme(tree)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f'selectors:\n- {{addresses: ["{MLX}"], numVfs: 4}}\n')
    # a VM holds the first VF's group
    (tree.root / "proc/812/fd").mkdir(parents=True)
    (tree.root / "proc/812/fd/31").symlink_to("/dev/vfio/61")
    (tree.root / "proc/812/comm").write_text("qemu-kvm\n")
    p = run("sriov", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert set(rows) == {PF, MLX}
    assert rows[PF] | {"held": None} == {
        "address": PF, "ids": "1b36:0010", "driver": "nvme", "totalvfs": 2, "numvfs": 0,
        "wanted": None, "autoprobe": 1, "vfs": [], "made_by": None, "before": None,
        "held": None, "why_not": [], "interrupted": None,
    }  # fmt: skip
    mlx = rows[MLX]
    assert (mlx["numvfs"], mlx["wanted"], mlx["vfs"]) == (2, 4, ["0000:af:00.1", "0000:af:00.2"])
    assert mlx["held"] == {
        "0000:af:00.1": ["/dev/vfio/61 is held open by pid 812 (qemu-kvm) fd 31"]
    }
    assert any("is held" in w for w in mlx["why_not"])
    assert any("did not make" in w for w in mlx["why_not"])
    table = run("sriov", "--root", str(tree.root), "--config", str(cfg))
    assert table.returncode == 0 and "WANTED" in table.stdout and "pid 812" in table.stdout


def test_set_dry_run_prints_pasteable_writes(tree: SysfsTree) -> None:
    nvme(tree)
    p = run("sriov", "set", "--root", str(tree.root), "--dry-run", PF, "2")
    assert p.returncode == 0, p.stderr
    base = f"{tree.root}/sys/bus/pci/devices/{PF}"
    assert p.stdout.splitlines() == [
        f"echo 0 > {base}/sriov_drivers_autoprobe",
        f"echo 2 > {base}/sriov_numvfs",
    ]
    assert (tree.dev_dir(PF) / "sriov_numvfs").read_text().strip() == "0"


def test_set_refusals(tree: SysfsTree) -> None:
    nvme(tree)
    p = run("sriov", "set", "--root", str(tree.root), PF, "3")
    assert p.returncode == 1 and "at most 2 VFs (sriov_totalvfs), not 3" in p.stderr
    p = run("sriov", "set", "--root", str(tree.root), "--dry-run", MLX, "4")
    assert p.returncode == 1 and "add --force" in p.stderr
    p = run("sriov", "set", "--root", str(tree.root), "--dry-run", "--force", MLX, "4")
    assert p.returncode == 0 and "forced:" in p.stderr
    assert p.stdout.splitlines()[0].startswith(f"echo 0 > {tree.root}/sys/bus/pci/devices/{MLX}")
    p = run("sriov", "set", "--root", str(tree.root), PF, "-1")
    assert p.returncode == 2
    p = run("sriov", "set", "--root", str(tree.root), "0000:03:01.0", "1")
    assert p.returncode == 1 and "not an SR-IOV PF" in p.stderr
    # a prepared DRA claim holds a VF: refused even with --force
    ck = tree.root / "var/lib/vfio_dp/dra-vfio.example.com.checkpoint.json"
    ck.parent.mkdir(parents=True, exist_ok=True)
    ck.write_text(json.dumps({"version": 1, "claims": {"u1": {
        "namespace": "default", "name": "vm", "uid": "u1", "state": "prepared",
        "devices": [{"requests": ["vf"], "pool": "node", "device": "pci-0000-af-00-2",
                     "addresses": ["0000:af:00.2"]}]}}}))  # fmt: skip
    p = run("sriov", "set", "--root", str(tree.root), "--dry-run", "--force", MLX, "0")
    assert p.returncode == 1 and "claim default/vm (prepared, vfio.example.com)" in p.stderr


def test_unbind_all_gives_vf_counts_back(tree: SysfsTree) -> None:
    """A record says vfio_dp took the mlx PF from 0 to its 2 VFs: unbind --all gives it back."""
    d = tree.root / "var/lib/vfio_dp/sriov"
    d.mkdir(parents=True)
    (d / f"{MLX}.json").write_text(json.dumps(
        {"address": MLX, "before": 0, "autoprobe_before": 1, "count": 2, "by": "daemon"}))  # fmt: skip
    (tree.dev_dir(MLX) / "sriov_drivers_autoprobe").write_text("0\n")
    p = run("unbind", "--all", "--dry-run", "--root", str(tree.root))
    assert p.returncode == 0, p.stderr
    base = f"{tree.root}/sys/bus/pci/devices/{MLX}"
    assert p.stdout.splitlines()[:3] == [
        f"# {MLX}: SR-IOV PF back to 0 VFs",
        f"echo 0 > {base}/sriov_numvfs",
        f"echo 1 > {base}/sriov_drivers_autoprobe",
    ]
    assert os.path.exists(d / f"{MLX}.json")


async def test_a_pods_vf_is_held(tree: SysfsTree, tmp_path: Path) -> None:
    """The kubelet's PodResources API (stand-in, real gRPC) says a pod has a VF: refused."""
    import asyncio

    from tests.cli.test_host_commands import VFIOCTL
    from tests.deviceplugin.podresources_standin import Pod, PodResourcesStandin

    pr = PodResourcesStandin(str(tmp_path / "pr.sock"))
    await pr.start()
    pr.pods = [Pod("default", "vm-b", "compute", "example.com/mlx-vf", ["0000:af:00.2"])]
    try:
        args = ["sriov", "set", "--root", str(tree.root), "--dry-run", "--force"]
        proc = await asyncio.create_subprocess_exec(
            *VFIOCTL, *args, "--pod-resources-socket", pr.socket, MLX, "0",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
    finally:
        await pr.stop()
    assert proc.returncode == 1 and pr.calls == 1, err
    assert b"pod default/vm-b container compute (resource example.com/mlx-vf)" in err


def ours_at_two_unbound(tree: SysfsTree) -> None:
    """The PF at 2 VFs that vfio_dp made (its record says so), the VFs on no driver: what a
    bind killed or failed after the count change leaves."""
    nvme(tree)
    tree.ensure_driver("vfio-pci")
    for i, vf in enumerate(("0000:01:00.1", "0000:01:00.2")):
        tree.add(Dev(vf, "1b36", "0010", "010802", group=20 + i, parent="0000:00:1b.0",
                     physfn=PF))  # fmt: skip
    (tree.dev_dir(PF) / "sriov_numvfs").write_text("2\n")
    (tree.dev_dir(PF) / "sriov_drivers_autoprobe").write_text("0\n")
    d = tree.root / "var/lib/vfio_dp/sriov"
    d.mkdir(parents=True)
    (d / f"{PF}.json").write_text(json.dumps(
        {"address": PF, "before": 0, "autoprobe_before": 1, "count": 2, "by": "operator"}))  # fmt: skip


def test_set_fails_when_the_vfs_cannot_be_bound(tree: SysfsTree) -> None:
    """Issue 37 items 1 and 3: ``set PF 2`` on a PF already at 2 VFs of ours that are on no
    driver binds them -- here the temp tree's drivers_probe attaches nothing, so the bind
    fails, and that is a failure (exit 1 with the reason), never "already 2 VFs" and 0."""
    ours_at_two_unbound(tree)
    p = run("sriov", "set", "--root", str(tree.root), PF, "2")
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"could not bind 2 VF(s) of {PF}" in p.stderr and "vfio-pci" in p.stderr
    assert "Traceback" not in p.stderr
    p = run("sriov", "set", "--root", str(tree.root), "-o", "json", PF, "2")
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout)
    assert out["already"] is True and f"could not bind 2 VF(s) of {PF}" in out["error"]


def test_set_under_the_groups_root_touches_nothing_outside_it(
    tree: SysfsTree, tmp_path: Path
) -> None:
    """Issue 37 item 4: ``vfioctl sriov --root T set ...`` answers about T and, without
    ``--dry-run``, reads and writes under T only: traced (strace), no path under /sys, /proc,
    /dev/vfio, /run or /var/lib/vfio_dp of this machine is opened, made or removed (the
    kubelet's PodResources socket is the one path never joined with --root)."""
    import shutil
    import subprocess

    from tests.cli.test_host_commands import VFIOCTL

    nvme(tree)
    base = f"{tree.root}/sys/bus/pci/devices/{PF}"
    p = run("sriov", "--root", str(tree.root), "set", "--dry-run", PF, "2")
    assert p.returncode == 0, p.stderr  # the dry run first: never act on / if it is ignored
    assert p.stdout.splitlines() == [
        f"echo 0 > {base}/sriov_drivers_autoprobe",
        f"echo 2 > {base}/sriov_numvfs",
    ]
    p = run("sriov", "--root", str(tree.root), "-o", "json", "set", "--dry-run", PF, "2")
    assert p.returncode == 0 and json.loads(p.stdout)["steps"][1] == f"echo 2 > {base}/sriov_numvfs"
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (apt-get install strace): the real run is not traced")
    log = tmp_path / "trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    p = subprocess.run(
        [strace, "-f", "-qq", "-o", str(log), "-e", "trace=%file,%desc,connect",
         *VFIOCTL, "sriov", "--root", str(tree.root), "set", PF, "2"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert (tree.dev_dir(PF) / "sriov_numvfs").read_text().strip() == "2"  # written under T
    assert (tree.root / f"var/lib/vfio_dp/sriov/{PF}.json").is_file()
    outside = ("/sys", "/proc", "/dev/vfio", "/run", "/var/lib/vfio_dp", "/lib/modules")
    allowed = "/var/lib/kubelet/pod-resources/kubelet.sock"
    seen = [
        path
        for line in log.read_text().splitlines()
        for path in line.split('"')[1::2]
        if path.startswith("/") and not path.startswith(str(tree.root)) and path != allowed
    ]
    assert seen, "the trace names no absolute path: is strace tracing anything?"
    touched = [s for s in seen if s.startswith(outside)]
    assert touched == [], touched


def test_a_5000_digit_totalvfs_is_named_not_a_traceback(tree: SysfsTree) -> None:
    """Issue 37 item 5: a count no kernel writes is an error naming the file and the value;
    the listing leaves that PF out (and says why) and shows the others."""
    nvme(tree)
    (tree.dev_dir(PF) / "sriov_totalvfs").write_text("9" * 5000 + "\n")
    p = run("sriov", "set", "--root", str(tree.root), "--dry-run", PF, "2")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"{tree.root}/sys/bus/pci/devices/{PF}/sriov_totalvfs reads '9999" in p.stderr
    assert "not a decimal number" in p.stderr and len(p.stderr) < 1000
    p = run("sriov", "--root", str(tree.root), "-o", "json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert [r["address"] for r in json.loads(p.stdout)] == [MLX]
    assert f"{PF}/sriov_totalvfs reads" in p.stderr


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_set_sigkilled_mid_bind_is_recovered_by_the_next_set(tree: SysfsTree) -> None:
    """Issue 37 item 1 with a real SIGKILL: strace kills ``vfioctl sriov set`` right after
    each sysfs write of its bind of the VFs (``-P`` counts only the writes to the VFs'
    ``driver_override`` and ``drivers_probe``: one writer thread makes them all). The next
    ``set`` finishes or undoes the interrupted bind (the journal goes) and tries the bind
    again -- never "already 2 VFs" with the journal left. On a temp tree nothing attaches, so
    that bind fails (exit 1); the kernel simulator's tests show it succeeding."""
    import subprocess

    from tests.cli.test_host_commands import VFIOCTL

    ours_at_two_unbound(tree)
    vfs = ("0000:01:00.1", "0000:01:00.2")
    files = [os.path.realpath(tree.dev_dir(v) / "driver_override") for v in vfs]
    files.append(os.path.realpath(tree.root / "sys/bus/pci/drivers_probe"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    cmd = [*VFIOCTL, "sriov", "set", "--root", str(tree.root), PF, "2"]
    ops = tree.root / "var/lib/vfio_dp/ops"
    k = 1
    while True:  # kill right after write k: on entering write k + 1
        spec = ["-e", "trace=write", "-e", f"inject=write:signal=KILL:when={k + 1}"]
        paths = [a for f in files for a in ("-P", f)]
        strace = [shutil.which("strace") or "strace", "-f", "-qq", "-o", os.devnull]
        p = subprocess.run([*strace, *paths, *spec, *cmd], capture_output=True, text=True,
                           timeout=60, env=env)  # fmt: skip
        if p.returncode != -9 and p.returncode != 128 + 9:
            assert k >= 4, (k, p.returncode, p.stderr)  # both VFs' bind writes were made
            break  # fewer than k + 1 writes: every kill point was tried
        assert list(ops.glob("*.json")), f"killed after write {k}: no journal left"
        p = run(*cmd[len(VFIOCTL) :])
        where = f"killed after sysfs write {k}: {p.stdout} {p.stderr}"
        assert p.returncode == 1 and "already 2 VFs" in p.stdout, where
        assert "undid the interrupted bind" in p.stderr, where
        assert f"could not bind 2 VF(s) of {PF}" in p.stderr, where  # tried again
        assert list(ops.glob("*.json")) == [], where
        k += 1
