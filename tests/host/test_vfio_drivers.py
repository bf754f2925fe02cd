"""VFIO drivers other than vfio-pci, on temp trees with the kernel simulator (issue 34).

What a real kernel here cannot show: variant drivers chosen from ``modules.alias`` (the rule
of kernel commit cc6711b0, :mod:`vfio_dp.model.vfio_driver`), vendor VFIO providers
recognised per device, and the failures around them. The same paths run against a real
kernel in the guest (tests/guest).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import BindError, RefusedError
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text
from vfio_dp.model.device import PciDevice
from vfio_dp.model.vfio_driver import choose, matching, parse_vfio_aliases

CATCH_ALL = "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci"
MLX5 = "alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci"
MLX_VENDOR = "alias vfio_pci:v000015B3d*sv*sd*bc*sc*i* mlx_any_vfio_pci"
E1000E_SUB = "alias vfio_pci:v00008086d000010D3sv00008086sd0000A01Fbc*sc*i* sub_vfio_pci"
E1000E = "alias vfio_pci:v00008086d000010D3sv*sd*bc*sc*i* e1000e_vfio_pci"
GPU_CLASS = "alias vfio_pci:v*d*sv*sd*bc03sc02i* gpu_vfio_pci"
ALIASES = [
    "alias pci:v00008086d000010D3sv*sd*bc*sc*i* e1000e",  # a normal alias: ignored
    CATCH_ALL,
    MLX_VENDOR,
    MLX5,
    E1000E,
    E1000E_SUB,
    GPU_CLASS,
]

VF = "0000:af:00.1"  # ConnectX VF, 15b3:101e, on mlx5_core
NIC = "0000:01:00.0"  # e1000e, 8086:10d3 subsystem 8086:a01f


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


def _tree(tmp_path: Path, lines: list[str] | None = ALIASES) -> SysfsTree:
    t = SysfsTree(tmp_path)
    t.add(Dev(VF, "15b3", "101e", "020000", driver="mlx5_core", group=61))
    t.add(Dev(NIC, "8086", "10d3", "020000", driver="e1000e", group=5,
              subsystem_vendor="8086", subsystem_device="a01f"))  # fmt: skip
    t.add(Dev("0000:02:00.0", "8086", "10d3", "020000", driver="e1000e", group=6))
    t.add(Dev("0000:03:00.0", "15b3", "1234", "020000", driver="mlx5_core", group=7))
    t.add(Dev("0000:04:00.0", "1af4", "1041", "020000", driver="virtio-pci", group=8))
    t.add(Dev("0000:05:00.0", "1234", "1111", "030200", driver="nouveau", group=9))
    t.set_modules_alias(lines)
    return t


def _kernel(t: SysfsTree) -> SimulatedKernel:
    k = SimulatedKernel(t)
    for m in ("mlx5_vfio_pci", "mlx_any_vfio_pci", "e1000e_vfio_pci", "sub_vfio_pci"):
        k.modules[m] = (m, True)
    k.modules["gpu_vfio_pci"] = ("gpu-vfio-pci", True)  # a driver named unlike its module
    return k


def _choice(t: SysfsTree, addr: str, wanted: str = "auto") -> str:
    h = Host(t.root)
    inv = h.scan_groups([A(addr)])
    c = h.vfio_choices(inv, [A(addr)], wanted)[A(addr)]
    return c.problem or f"{c.driver} {c.module} | {c.why}"


# -- the choice ---------------------------------------------------------------------------
def test_most_specific_alias_wins(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    # vendor and device beat vendor-only beat the catch-all
    assert _choice(t, VF) == f"mlx5_vfio_pci mlx5_vfio_pci | modules.alias: {MLX5}"
    # vendor-only beats the catch-all
    assert _choice(t, "0000:03:00.0").endswith(f"modules.alias: {MLX_VENDOR}")
    # subsystem IDs beat vendor:device alone
    assert _choice(t, NIC).endswith(f"modules.alias: {E1000E_SUB}")
    assert _choice(t, "0000:02:00.0").endswith(f"modules.alias: {E1000E}")
    # a class pattern beats the catch-all (5 wildcards against 6)
    assert _choice(t, "0000:05:00.0").endswith(f"modules.alias: {GPU_CLASS}")
    # nothing specific: vfio_pci's catch-all, whose driver is vfio-pci
    assert _choice(t, "0000:04:00.0") == f"vfio-pci vfio_pci | modules.alias: {CATCH_ALL}"


def test_matching_is_modprobes_fnmatch_over_the_vfio_prefixed_modalias() -> None:
    aliases = parse_vfio_aliases("\n".join(ALIASES) + "\n# alias vfio_pci:v* commented\n")
    assert [a.module for a in aliases] == [
        "vfio_pci", "mlx_any_vfio_pci", "mlx5_vfio_pci", "e1000e_vfio_pci", "sub_vfio_pci",
        "gpu_vfio_pci",
    ]  # fmt: skip
    found = matching(aliases, "pci:v000015B3d0000101Esv000015B3sd00000001bc02sc00i00")
    assert [a.module for a in found] == ["mlx5_vfio_pci", "mlx_any_vfio_pci", "vfio_pci"]
    # case matters, as in modprobe: a lowercase modalias matches only the catch-all
    found = matching(aliases, "pci:v000015b3d0000101esv000015b3sd00000001bc02sc00i00")
    assert [a.module for a in found] == ["vfio_pci"]


def test_the_modalias_is_built_from_the_scanned_ids_as_the_kernel_prints_it(
    tmp_path: Path,
) -> None:
    # drivers/pci/pci-sysfs.c modalias_show: "pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X"
    # over the same cached pci_dev fields the scan reads from <bdf>/uevent; the real-kernel
    # leg (tests/guest/test_host_real_kernel.py) checks every guest device against its file
    dev = PciDevice(A(NIC), "8086", "10d3", "020000", "8086", "a01f")
    from vfio_dp.model.vfio_driver import modalias_of

    assert modalias_of(dev) == "pci:v00008086d000010D3sv00008086sd0000A01Fbc02sc00i00"
    # a <bdf>/modalias file is not read per device: the scan's IDs decide
    t = _tree(tmp_path)
    (t.dev_dir("0000:04:00.0") / "modalias").write_text(
        "pci:v000015B3d0000101Esv00000000sd00000000bc02sc00i00\n"
    )
    assert _choice(t, "0000:04:00.0") == f"vfio-pci vfio_pci | modules.alias: {CATCH_ALL}"


def test_missing_or_unreadable_modules_alias_falls_back_to_vfio_pci_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = _tree(tmp_path / "a", None)
    caplog.set_level(logging.WARNING, "vfio_dp.host")
    assert _choice(t, VF).startswith("vfio-pci vfio_pci | ")
    assert "modules.alias cannot be read" in _choice(t, VF)
    said = [r for r in caplog.records if "modules.alias" in r.getMessage()]
    assert len(said) == 1 and "vfio-pci is used for every device" in said[0].getMessage()
    res = Host(t.root, kernel=_kernel(t)).bind([A(VF)])
    assert res.bound == [A(VF)] and t.driver_of(VF) == "vfio-pci"
    # unreadable (a directory where the file should be)
    u = _tree(tmp_path / "b", None)
    (u.root / "lib/modules/6.1.0-test/modules.alias").mkdir()
    assert _choice(u, VF).startswith("vfio-pci vfio_pci | ")


# -- binding to the choice ------------------------------------------------------------------
def test_bind_loads_the_variant_writes_its_driver_name_and_unbind_restores(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    k = _kernel(t)
    h = Host(t.root, kernel=k)
    dry = h.bind([A(VF)], dry_run=True)
    assert [str(s) for s in dry.steps] == [
        "modprobe mlx5_vfio_pci",
        f"echo 'mlx5_vfio_pci' > {t.root}/sys/bus/pci/devices/{VF}/driver_override",
        f"echo '{VF}' > {t.root}/sys/bus/pci/drivers/mlx5_core/unbind",
        f"echo '{VF}' > {t.root}/sys/bus/pci/drivers_probe",
    ]
    assert k.writes == [] and k.modprobed == []
    journals: list[dict[str, object]] = []
    real_step = h.state.step

    def watch(op, address, done, next_write):  # type: ignore[no-untyped-def]
        journals.append(
            json.loads(next(iter((t.root / "var/lib/vfio_dp/ops").iterdir())).read_text())
        )
        return real_step(op, address, done, next_write)

    h.state.step = watch  # type: ignore[method-assign]
    res = h.bind([A(VF)])
    assert res.bound == [A(VF)] and res.drivers[A(VF)].driver == "mlx5_vfio_pci"
    assert k.modprobed == ["mlx5_vfio_pci"]
    assert t.driver_of(VF) == "mlx5_vfio_pci" and t.override_of(VF) == "mlx5_vfio_pci"
    # the journal says where the device goes (the field a previous release reads as before)
    assert journals and all(j["devices"][0]["target"] == "mlx5_vfio_pci" for j in journals)
    # the bind record keeps its exact fields
    rec = json.loads((t.root / f"var/lib/vfio_dp/original/{VF}.json").read_text())
    assert set(rec) == {"address", "driver", "driver_override", "vendor", "device", "bound_by"}
    assert rec["driver"] == "mlx5_core"
    inv = h.scan()
    assert inv.devices[A(VF)].on_vfio and inv.devices[A(VF)].vfio_driver == "mlx5_vfio_pci"
    assert inv.groups[61].viable
    out = h.unbind([A(VF)])
    assert out.restored == [(A(VF), "mlx5_core")] and t.override_of(VF) is None


def test_a_module_whose_driver_name_differs_is_bound_by_its_driver_name(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    h = Host(t.root, kernel=_kernel(t))
    assert h.bind([A("0000:05:00.0")]).bound == [A("0000:05:00.0")]
    assert t.driver_of("0000:05:00.0") == "gpu-vfio-pci"  # /sys/module/gpu_vfio_pci/drivers/pci:
    assert t.override_of("0000:05:00.0") == "gpu-vfio-pci"


def test_vfio_driver_vfio_pci_overrides_the_variant(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    k = _kernel(t)
    Host(t.root, kernel=k).bind([A(VF)], vfio_driver="vfio-pci")
    assert t.driver_of(VF) == "vfio-pci" and "mlx5_vfio_pci" not in k.modprobed


def test_a_named_driver_that_cannot_serve_refuses_before_any_write(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    k = _kernel(t)
    with pytest.raises(RefusedError, match="vfioDriver nvgrace_gpu_vfio_pci cannot serve"):
        Host(t.root, kernel=k).bind([A(VF)], vfio_driver="nvgrace_gpu_vfio_pci")
    assert k.writes == [] and k.modprobed == []
    assert not list((t.root / "var/lib/vfio_dp").glob("**/*.json"))
    # a named variant whose alias matches is taken, even when auto would choose another
    Host(t.root, kernel=k).bind([A(VF)], vfio_driver="mlx_any_vfio_pci")
    assert t.driver_of(VF) == "mlx_any_vfio_pci"


def test_a_module_that_fails_to_load_leaves_nothing_half_bound(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    k = _kernel(t)
    k.broken_modules.add("mlx5_vfio_pci")
    h = Host(t.root, kernel=k)
    with pytest.raises(BindError) as err:
        h.bind([A(VF), NIC_A], group=True)
    msg = str(err.value)
    assert "loading mlx5_vfio_pci" in msg and "nothing was bound" in msg and "Unknown symbol" in msg
    assert t.driver_of(VF) == "mlx5_core" and t.driver_of(NIC) == "e1000e"
    assert t.override_of(VF) is None and k.writes == []
    state = t.root / "var/lib/vfio_dp"
    assert not list(state.glob("original/*.json")) and not list(state.glob("ops/*.json"))
    assert h.interrupted() == ([], [])


NIC_A = A(NIC)


# -- on VFIO, per device --------------------------------------------------------------------
def _provider_tree(tmp_path: Path) -> SysfsTree:
    """A vendor driver (``nvidia``) on a host GPU (PF, group 10) and on one of its VFs that
    it registered with VFIO itself (group 11, whose /dev/vfio/11 the kernel made)."""
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:3b:00.0", "10de", "2330", "030200", driver="nvidia", group=10,
              sriov_totalvfs=4, sriov_numvfs=1))  # fmt: skip
    t.add(Dev("0000:3b:00.4", "10de", "2331", "030200", driver="nvidia", group=11,
              physfn="0000:3b:00.0", registers_vfio=True))  # fmt: skip
    t.set_modules_alias([CATCH_ALL])
    return t


def test_vendor_provider_vf_is_ready_and_its_host_pf_is_not(tmp_path: Path) -> None:
    t = _provider_tree(tmp_path)
    assert (t.root / "dev/vfio/11").exists() and not (t.root / "dev/vfio/10").exists()
    h = Host(t.root, kernel=SimulatedKernel(t))
    inv = h.scan()
    vf, pf = inv.devices[A("0000:3b:00.4")], inv.devices[A("0000:3b:00.0")]
    assert vf.on_vfio and vf.vfio_driver == "nvidia" and inv.groups[11].viable
    assert not pf.on_vfio and pf.vfio_driver is None and not inv.groups[10].viable
    ready, pf_report = h.check([A("0000:3b:00.4"), A("0000:3b:00.0")])
    assert ready.ready and ready.vfio_driver == "nvidia"
    assert not pf_report.ready and pf_report.vfio_driver is None
    # never rebound: bind says it is already there, writes nothing
    k = SimulatedKernel(t)
    res = Host(t.root, kernel=k).bind([A("0000:3b:00.4")])
    assert res.already == [A("0000:3b:00.4")] and res.bound == [] and k.writes == []
    # unbind --all: no record, so not touched
    res = Host(t.root, kernel=k).unbind_all()
    assert k.writes == [] and t.driver_of("0000:3b:00.4") == "nvidia"


def test_bind_true_never_rebinds_a_device_on_a_vendor_provider(tmp_path: Path) -> None:
    from vfio_dp.core.policy import autobind_groups

    t = _provider_tree(tmp_path)
    inv = Host(t.root).scan()
    cfg = load_config_text('selectors:\n  - vendor: "10de"\n    bind: true\n', "test")
    # the host PF is bound, never the VF its vendor driver registered with VFIO
    assert autobind_groups(inv, cfg, inv.devices, "devicePlugin") == [[A("0000:3b:00.0")]]


def test_device_with_vfio_dev_is_on_vfio(tmp_path: Path) -> None:
    """A kernel with VFIO cdev: ``<bdf>/vfio-dev/vfioN`` and ``/dev/vfio/devices/vfioN``, and
    (no CONFIG_VFIO_GROUP) no ``/dev/vfio/<N>`` at all."""
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:3b:00.4", "10de", "2331", "030200", driver="nvidia", group=11))
    t.add(Dev("0000:3c:00.0", "10de", "2330", "030200", driver="nvidia", group=12))
    (t.dev_dir("0000:3b:00.4") / "vfio-dev/vfio3").mkdir(parents=True)
    (t.root / "dev/vfio/devices").mkdir()
    (t.root / "dev/vfio/devices/vfio3").write_text("")
    inv = Host(t.root).scan()
    dev = inv.devices[A("0000:3b:00.4")]
    assert dev.on_vfio and dev.vfio_cdev == "vfio3" and inv.groups[11].viable
    assert not inv.devices[A("0000:3c:00.0")].on_vfio


def test_variant_bound_by_hand_is_ready_even_beside_vfio_pci(tmp_path: Path) -> None:
    """The alias rule: a group whose node vfio-pci explains still counts its member on a
    variant driver (a module named by a vfio_pci: line) as on VFIO."""
    t = _tree(tmp_path)
    t.add(Dev("0000:af:00.2", "15b3", "101e", "020000", driver="vfio-pci", group=61))
    t.load_module("mlx5_vfio_pci", vfio=True)
    t.set_driver(VF, "mlx5_vfio_pci")
    t.set_override(VF, "mlx5_vfio_pci")
    inv = Host(t.root).scan()
    assert inv.devices[A(VF)].on_vfio and inv.groups[61].viable
    k = _kernel(t)
    res = Host(t.root, kernel=k).bind([A(VF)], group=True)
    assert res.bound == [] and k.writes == []
    # a host driver beside vfio-pci in one group is not on VFIO (the node is vfio-pci's)
    t.set_driver(VF, "mlx5_core")
    inv = Host(t.root).scan()
    assert not inv.devices[A(VF)].on_vfio and not inv.groups[61].viable


def test_mdev_parent_is_never_a_unit(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:00:02.0", "8086", "3e92", "030000", driver="i915", group=2))
    parent = t.dev_dir("0000:00:02.0")
    (parent / "mdev_supported_types/i915-GVTg_V5_4").mkdir(parents=True)
    t._link(t.sys("class/mdev_bus/0000:00:02.0"), parent)
    (t.root / "dev/vfio/2").write_text("")  # even with a node, the parent is not on VFIO
    h = Host(t.root, kernel=SimulatedKernel(t))
    inv = h.scan()
    assert inv.devices[A("0000:00:02.0")].mdev_parent and not inv.devices[A("0000:00:02.0")].on_vfio
    with pytest.raises(RefusedError, match="mediated-device parent"):
        h.bind([A("0000:00:02.0")])
    (report,) = h.check([A("0000:00:02.0")])
    assert not report.ready and report.would_bind is None


def test_mdev_parents_are_read_inside_the_root_only(tmp_path: Path) -> None:
    """Parent marking reads ``sys/class/mdev_bus`` as the mdev inventory does (one reader,
    :func:`vfio_dp.host.mdev.parent_names`): a bus directory that is a link out of the root
    names no parent, so a device is not taken for one by what lies outside."""
    t = SysfsTree(tmp_path / "host")
    t.add(Dev("0000:00:02.0", "8086", "3e92", "030000", driver="i915", group=2))
    outside = tmp_path / "outside"
    (outside / "0000:00:02.0").mkdir(parents=True)
    t.sys("class").mkdir(parents=True, exist_ok=True)
    t.sys("class/mdev_bus").symlink_to(outside)
    inv = Host(t.root).scan()
    assert not inv.devices[A("0000:00:02.0")].mdev_parent


def test_check_says_which_variant_a_bind_would_choose(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    (report,) = Host(t.root).check([A(VF)])
    assert report.would_bind == f"mlx5_vfio_pci (modules.alias: {MLX5})"
    (report,) = Host(t.root).check([A(VF)], vfio_driver="nvgrace_gpu_vfio_pci")
    assert any("cannot serve" in r for r in report.reasons)


def test_refresh_and_reread_follow_a_provider_node(tmp_path: Path) -> None:
    """The daemon's cheap rescan sees a device become ready when its vendor driver registers
    it with VFIO (the node appears), and stop being ready when it is gone."""
    t = _provider_tree(tmp_path)
    h = Host(t.root)
    inv = h.scan()
    assert inv.devices[A("0000:3b:00.4")].on_vfio
    (t.root / "dev/vfio/11").unlink()
    inv = h.refresh(inv)
    assert not inv.devices[A("0000:3b:00.4")].on_vfio and not inv.groups[11].viable
    (t.root / "dev/vfio/11").write_text("")
    inv = h.reread(inv, [A("0000:3b:00.4")])
    assert inv.devices[A("0000:3b:00.4")].on_vfio and inv.groups[11].viable


def test_choose_pure_rules() -> None:
    dev = PciDevice(A(VF), "15b3", "101e", "020000")
    aliases = parse_vfio_aliases("\n".join(ALIASES))
    modalias = "pci:v000015B3d0000101Esv00000000sd00000000bc02sc00i00"
    assert choose(dev, modalias, aliases).driver == "mlx5_vfio_pci"
    assert choose(dev, modalias, aliases, "vfio-pci").driver == "vfio-pci"
    loaded = choose(dev, modalias, aliases, "nvidia", loaded=frozenset({"nvidia"}))
    assert loaded.problem is None and loaded.why == "vfioDriver: nvidia (loaded)"
    assert choose(dev, modalias, aliases, "nvidia").problem is not None
    fallback = choose(dev, modalias, None, unread="x cannot be read")
    assert fallback.driver == "vfio-pci" and fallback.why.startswith("x cannot be read")


def test_on_prepare_never_rebinds_a_group_on_a_vendor_provider(tmp_path: Path) -> None:
    """``bind: onPrepare``: Prepare binds only groups off VFIO (``off_vfio``); a provider's VF
    is handed over as it is, its host PF would be bound."""
    from vfio_dp.dra.claimpath.claims import AllocationResult
    from vfio_dp.dra.claimpath.resolve import Chosen, off_vfio, to_bind
    from vfio_dp.model.serving import dra_units

    t = _provider_tree(tmp_path)
    inv = Host(t.root).scan()
    cfg = load_config_text(
        'selectors:\n  - vendor: "10de"\n    path: dra\n    bind: onPrepare\n', "c.yaml"
    )
    units = {u.primary: u for u in dra_units(inv, cfg)}
    vf, pf = units[A("0000:3b:00.4")], units[A("0000:3b:00.0")]
    assert off_vfio(vf, inv) == [] and off_vfio(pf, inv) == [pf.primary]
    chosen = [Chosen(AllocationResult("r", "d", "node", u.name), u) for u in (vf, pf)]
    assert to_bind(chosen, inv) == [pf.primary]


def test_dra_withdraws_an_on_prepare_group_whose_named_vfio_driver_this_node_lacks(
    tmp_path: Path,
) -> None:
    """A selector's ``vfioDriver`` the node cannot serve: the DRA plugin does not publish
    the group (the reason names the driver and the fix) while the rest of the config applies;
    ``auto`` and a servable name publish as before."""
    from vfio_dp.dra.claimpath.resolve import unservable
    from vfio_dp.model.serving import dra_units

    t = _tree(tmp_path)
    h = Host(t.root)
    inv = h.scan()

    def units(text: str) -> dict[str, tuple[str, ...]]:
        cfg = load_config_text(text, "c.yaml")
        got = unservable(dra_units(inv, cfg), inv, lambda a, w: h.vfio_choices(inv, a, w))
        return {u.name: u.reasons for u in got}

    base = (
        'selectors:\n  - vendor: "15b3"\n    device: "101e"\n    path: dra\n    bind: onPrepare\n'
    )
    assert units(base)["pci-0000-af-00-1"] == ()
    assert units(base + "    vfioDriver: mlx_any_vfio_pci\n")["pci-0000-af-00-1"] == ()
    (why,) = units(base + "    vfioDriver: nvgrace_gpu_vfio_pci\n")["pci-0000-af-00-1"]
    assert "vfioDriver nvgrace_gpu_vfio_pci cannot serve" in why and "install" in why


def test_device_plugin_advertises_a_provider_vf_healthy_with_its_group_node(
    tmp_path: Path,
) -> None:
    """The device plugin's listing and health take the one answer: a vendor provider's VF is
    a healthy unit and its ``/dev/vfio/<N>`` is what Allocate hands out; the host PF is not
    healthy (not on VFIO)."""
    from vfio_dp.deviceplugin.listing import compute_listing

    t = _provider_tree(tmp_path)
    h = Host(t.root)
    inv = h.scan()
    cfg = load_config_text('selectors:\n  - vendor: "10de"\n    resourceName: vgpu\n', "c.yaml")
    units = {u.id: u for u in compute_listing(inv, cfg).units("devices.kubevirt.io/vgpu")}
    assert units[A("0000:3b:00.4")].healthy, units
    pf = units.get(A("0000:3b:00.0"))
    assert pf is None or (not pf.healthy and "not on vfio-pci" in " ".join(pf.reasons))
    group = inv.groups[11]
    assert h.device_nodes(group, [inv.devices[A("0000:3b:00.4")]]) == [
        "/dev/vfio/vfio", "/dev/vfio/11",
    ]  # fmt: skip


def test_a_variant_that_does_not_attach_is_rolled_back_to_the_host_driver(
    tmp_path: Path,
) -> None:
    """The restore path with a variant: drivers_probe "succeeds" but the variant does not take
    the device; the bind names the variant, rolls the device back to its host driver with its
    override cleared, and leaves no record or journal."""
    t = _tree(tmp_path)
    k = _kernel(t)
    k.refuse_attach.add((VF, "mlx5_vfio_pci"))
    with pytest.raises(BindError, match="not mlx5_vfio_pci") as err:
        Host(t.root, kernel=k).bind([A(VF)])
    assert f"rolled back {VF}" in str(err.value)
    assert t.driver_of(VF) == "mlx5_core" and t.override_of(VF) is None
    state = t.root / "var/lib/vfio_dp"
    assert not list(state.glob("original/*.json")) and not list(state.glob("ops/*.json"))


def test_plain_list_never_opens_modules_alias_and_wide_reads_it_once(tmp_path: Path) -> None:
    """``vfioctl list`` does not pay for the alias lookup; ``-o wide`` reads it once for all
    devices (kept for the process), seen by strace on the real process."""
    import shutil
    import subprocess
    import sys

    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (scripts/setup.sh installs it)")
    t = _tree(tmp_path / "t")

    def opens(*args: str) -> int:
        log = tmp_path / "strace.log"
        p = subprocess.run(
            [strace, "-f", "-qq", "-e", "trace=openat,open,openat2", "-o", str(log), sys.executable,
             "-c", "from cli.main import main; main()", "list", "--root", str(t.root), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        return log.read_text().count("modules.alias")

    assert opens() == 0
    assert opens("-o", "wide") == 1


def test_a_claims_group_read_lists_no_vfio_nodes_when_nothing_needs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DRA Prepare reads its claim's group (on vfio-pci): nothing there is judged by the
    group nodes, so ``/dev/vfio`` -- thousands of entries on a fleet node, read once per
    claim of a 1,000-claim call -- is not listed; a device on another driver still is."""
    from vfio_dp.host import vfio_drivers

    t = SysfsTree(tmp_path)
    t.add(Dev("0000:01:00.0", "8086", "1533", "020000", driver="vfio-pci", group=1))
    t.add(Dev("0000:02:00.0", "8086", "1533", "020000", driver="igb", group=2))
    listed: list[tuple[str, ...]] = []
    real = vfio_drivers._listdir

    def counting(root: Any, *parts: str) -> frozenset[str]:
        listed.append(parts)
        return real(root, *parts)

    monkeypatch.setattr(vfio_drivers, "_listdir", counting)
    host = Host(t.root)
    host.scan_groups([PciAddress.parse("0000:01:00.0")])
    assert ("dev", "vfio") not in listed
    host.scan_groups([PciAddress.parse("0000:02:00.0")])
    assert ("dev", "vfio") in listed
