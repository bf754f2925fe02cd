"""vfioctl and VFIO drivers other than vfio-pci (issue 34): what ``check``, ``list``,
``groups`` and ``bind --dry-run / --persist`` say, as a user runs them (real processes, temp
trees; the binds themselves are tests/host/test_vfio_drivers.py and the guest's)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_host_commands import run
from tests.sysfs_tree import Dev, SysfsTree

CATCH_ALL = "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci"
MLX5 = "alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci"
VF = "0000:af:00.1"


def _tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path)
    t.add(Dev(VF, "15b3", "101e", "020000", driver="mlx5_core", group=61))
    t.add(Dev("0000:3b:00.4", "10de", "2331", "030200", driver="nvidia", group=11,
              registers_vfio=True))  # fmt: skip
    t.add(Dev("0000:01:00.0", "8086", "10d3", "020000", driver="vfio-pci", group=5))
    t.set_modules_alias([CATCH_ALL, MLX5])
    return t


def test_check_says_which_variant_a_bind_would_choose(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    p = run("check", "--root", str(t.root), VF)
    assert p.returncode == 1
    assert f"  would bind mlx5_vfio_pci (modules.alias: {MLX5})" in p.stdout.splitlines()
    p = run("check", "--root", str(t.root), "-o", "json", "--vfio-driver", "vfio-pci", VF)
    (rep,) = json.loads(p.stdout)
    assert rep["vfioDriver"] == "vfio-pci (vfioDriver: vfio-pci)" and rep["vfio_driver"] is None
    # a vendor provider's VF: ready as it is, on its own driver
    p = run("check", "--root", str(t.root), "0000:3b:00.4")
    assert p.returncode == 0 and p.stdout.startswith("0000:3b:00.4: ready (on nvidia)"), p.stdout


def test_list_shows_the_vfio_driver_and_wide_and_json_the_choice(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    p = run("list", "--root", str(t.root))
    assert p.returncode == 0, p.stderr
    head, *rows = p.stdout.splitlines()
    assert head.lower().split()[:5] == ["address", "ids", "class", "driver", "vfio"]
    by = {r.split()[0]: r.split() for r in rows}
    assert by["0000:3b:00.4"][3:5] == ["nvidia", "nvidia"]
    assert by[VF][3:5] == ["mlx5_core", "-"]
    p = run("list", "--root", str(t.root), "-o", "json")
    got = {r["address"]: r for r in json.loads(p.stdout)}
    assert got[VF]["vfio_driver"] is None
    assert got[VF]["vfioDriver"] == {
        "driver": "mlx5_vfio_pci", "module": "mlx5_vfio_pci",
        "why": f"modules.alias: {MLX5}", "problem": None,
    }  # fmt: skip
    assert got["0000:3b:00.4"]["vfio_driver"] == "nvidia"
    p = run("list", "--root", str(t.root), "-o", "wide")
    assert f"mlx5_vfio_pci (modules.alias: {MLX5})" in p.stdout
    # a selector's vfioDriver the node cannot serve: said per device, the config still loads
    cfg = tmp_path / "c.yaml"
    cfg.write_text('selectors:\n  - vendor: "15b3"\n    vfioDriver: nope_vfio_pci\n')
    p = run("list", "--root", str(t.root), "-o", "json", "--config", str(cfg))
    assert p.returncode == 0, p.stderr
    row = next(r for r in json.loads(p.stdout) if r["address"] == VF)
    assert "vfioDriver nope_vfio_pci cannot serve" in row["vfioDriver"]["problem"]


def test_groups_mark_members_on_a_vfio_driver_other_than_vfio_pci(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    p = run("groups", "--root", str(t.root), "--no-probe", "-o", "wide")
    assert "0000:3b:00.4(nvidia:vfio)" in p.stdout and "0000:01:00.0(vfio-pci)" in p.stdout
    p = run("groups", "--root", str(t.root), "--no-probe", "-o", "json")
    g = {x["group"]: x for x in json.loads(p.stdout)}
    assert g[11]["vfio_drivers"] == {"0000:3b:00.4": "nvidia"} and g[11]["viable"]
    assert g[61]["vfio_drivers"] == {VF: None}


def test_bind_dry_run_and_persist_carry_the_variant(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    p = run("bind", "--root", str(t.root), "--dry-run", "--persist", VF)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert f"# {VF}: to mlx5_vfio_pci (modules.alias: {MLX5})" in lines
    assert "modprobe mlx5_vfio_pci" in lines
    assert f"echo 'mlx5_vfio_pci' > {t.root}/sys/bus/pci/devices/{VF}/driver_override" in lines
    rule = next(x for x in lines if x.startswith("# ") and "udev" in x)
    assert 'ATTR{driver_override}="mlx5_vfio_pci", RUN{builtin}+="kmod load mlx5_vfio_pci"' in rule
    p = run("bind", "--root", str(t.root), "--dry-run", "--vfio-driver", "vfio-pci", VF)
    assert f"echo 'vfio-pci' > {t.root}/sys/bus/pci/devices/{VF}/driver_override" in p.stdout
    p = run("bind", "--root", str(t.root), "--dry-run", "--vfio-driver", "no/such", VF)
    assert p.returncode == 2 and "not a kernel driver name" in p.stderr
