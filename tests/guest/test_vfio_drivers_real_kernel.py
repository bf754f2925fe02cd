"""VFIO drivers other than vfio-pci on a real kernel (issue 34 item 4): one guest boot.

The rig builds two modules of ours against Debian's headers of the guest kernel
(:func:`tests.guest.rig.build_modules`, sources in tests/guest/modules): a variant driver on
vfio_pci_core matching the emulated e1000e with ``PCI_DRIVER_OVERRIDE_DEVICE_VFIO``, and a
stand-in for a vendor VFIO provider. In the guest, ``depmod`` puts the variant's
``vfio_pci:`` line into ``modules.alias``; then the real ``vfioctl`` must choose it, bind
it, see the group viable, let QEMU open it, give the NIC back to e1000e, obey
``--vfio-driver vfio-pci``, and leave a variant or a provider bound by hand alone. The node
processes must choose it too: the ``bind: true`` device-plugin daemon binds it, advertises
it and hands its group out through ``Allocate``, and libvirt starts a VM from ``vfioctl
hostdev``'s XML for the allocated address; the DRA plugin publishes ``vfioDriver`` and its
``onPrepare`` binds the variant at Prepare and gives e1000e back at Unprepare.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Guest
from .rig import build_modules

pytestmark = pytest.mark.guest

LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
VARIANT, PROVIDER = "vfio_dp_e1000e_vfio_pci", "acme_accel"
ALIAS = f"alias vfio_pci:v00008086d000010D3sv*sd*bc*sc*i* {VARIANT}"
ENV = "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3"  # KubeVirt's variable for the resource


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    ko_dir = build_modules(guest.kernel.version)
    res = guest.run(
        '"$PYTHON" tests/guest/scenarios/vfio_drivers_scenario.py',
        timeout=1200,
        env={"VFIO_DP_KO_DIR": str(ko_dir)},
    )
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    out: dict[str, Any] = json.loads(res.files["vfio_drivers.json"])
    dp = out.get("device_plugin", {})
    # the legs' wall time in the guest, the libvirt met, <bdf>/vfio-dev on this kernel (-s)
    print(f"\nsecs {out['secs']}; libvirt {dp.get('libvirt_version')}; "
          f"vfio-dev {dp.get('vfio_dev_dir')}")  # fmt: skip
    return out


def test_depmod_writes_the_variants_alias_beside_the_catch_all(run: dict[str, Any]) -> None:
    assert run["overlay"]["rc"] == 0 and run["depmod"]["rc"] == 0, run["depmod"]
    assert ALIAS in run["alias_lines"]
    assert "alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci" in run["alias_lines"]
    # modprobe -R returns both: choosing the more specific one is the caller's job
    assert {VARIANT, "vfio_pci"} <= set(run["modprobe_R"]["stdout"].split())


def test_check_names_the_variant_and_bind_puts_the_nic_on_it(run: dict[str, Any]) -> None:
    assert f"would bind {VARIANT} (modules.alias: {ALIAS})" in run["check_before"]["stdout"]
    assert (
        f"echo '{VARIANT}' > /sys/bus/pci/devices/{LONE}/driver_override"
        in (run["dry_run"]["stdout"])
    )
    assert run["bind_variant"]["rc"] == 0, run["bind_variant"]["stderr"]
    assert json.loads(run["bind_variant"]["stdout"])["bound"] == [LONE]
    assert run["bind_variant"]["drivers_after"][LONE] == VARIANT
    assert run["override_after_bind"].strip() == VARIANT and run["node_after_bind"]
    assert "already" in run["bind_again"]["stdout"] and run["bind_again"]["rc"] == 0


def test_the_group_is_viable_for_us_and_for_the_kernel(run: dict[str, Any]) -> None:
    groups = {g["group"]: g for g in json.loads(run["groups_after_bind"]["stdout"])}
    g = groups[int(run["groups_of"][LONE])]
    assert g["viable"] and g["kernel_viable"] is True and g["vfio_drivers"] == {LONE: VARIANT}
    (rep,) = json.loads(run["check_after_bind"]["stdout"])
    assert rep["ready"] and rep["vfio_driver"] == VARIANT, rep
    rows = {r["address"]: r for r in json.loads(run["list_after_bind"]["stdout"])}
    assert rows[LONE]["vfio_driver"] == VARIANT
    assert rows[LONE]["vfioDriver"]["driver"] == VARIANT


def test_qemu_opens_the_device_on_the_variant(run: dict[str, Any]) -> None:
    assert run["qemu_running"] and run["qemu_vfio_device"], run["qemu_stderr"]


def test_unbind_gives_the_nic_back_to_e1000e(run: dict[str, Any]) -> None:
    assert run["unbind_variant"]["rc"] == 0, run["unbind_variant"]["stderr"]
    assert run["unbind_variant"]["drivers_after"][LONE] == "e1000e"
    assert run["override_after_unbind"].strip() in ("", "(null)")
    assert run["netdev_after_unbind"]


def test_vfio_driver_vfio_pci_binds_plain_vfio_pci(run: dict[str, Any]) -> None:
    assert run["bind_plain"]["rc"] == 0, run["bind_plain"]["stderr"]
    assert run["bind_plain"]["drivers_after"][LONE] == "vfio-pci"
    assert run["unbind_plain"]["drivers_after"][LONE] == "e1000e"


def test_the_bind_true_daemon_binds_the_variant_and_allocate_hands_its_group(
    run: dict[str, Any],
) -> None:
    dp = run["device_plugin"]
    assert "crash" not in dp, dp["crash"]
    assert dp["driver_advertised"] == VARIANT and dp["override_advertised"] == VARIANT, dp
    assert list(dp["advertised"].values()) == ["Healthy"], dp["advertised"]
    assert dp["envs"].get(ENV) == LONE, dp["envs"]
    node = f"/dev/vfio/{run['groups_of'][LONE]}"
    assert [node, "mrw", True] in dp["nodes"] and ["/dev/vfio/vfio", "mrw", True] in dp["nodes"]
    assert dp["driver_after_stop"] == VARIANT  # the daemon never unbinds


def test_a_vm_starts_from_vfioctl_hostdev_for_the_allocated_variant(run: dict[str, Any]) -> None:
    """libvirt 9.7 and later start it (its NEWS: variant drivers with ``managed=.no.``);
    older libvirt (9.0 in Debian 12, the rig's) knows no
    VFIO driver but vfio-pci for ``managed='no'`` and refuses with its own message; then QEMU
    given exactly the device the XML names opens it (what libvirt would have run)."""
    dp = run["device_plugin"]
    assert dp["hostdev"]["rc"] == 0, dp["hostdev"]
    # the same <hostdev> as for vfio-pci: managed='no', the host address
    xml = dp["vm_xml"].replace('"', "'")
    assert "<hostdev mode='subsystem' type='pci' managed='no'>" in xml, xml
    assert "<address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>" in xml, xml
    if dp["libvirt_version"] >= [9, 7]:
        assert dp["virsh_start"]["rc"] == 0, dp["virsh_start"]
        assert dp["vm"]["how"] == "libvirt", dp["vm"]
    else:
        msg = f"Unmanaged PCI device {LONE} must be manually detached from the host"
        assert msg in dp["virsh_start"]["stderr"], dp["virsh_start"]
        assert dp["vm"]["how"].startswith("QEMU"), dp["vm"]
    node = f"/dev/vfio/{run['groups_of'][LONE]}"
    assert node in dp["vm"]["fds"] and "anon_inode:[vfio-device]" in dp["vm"]["fds"], dp["vm"]


def test_unbind_all_gives_the_daemons_bind_back_to_e1000e(run: dict[str, Any]) -> None:
    r = run["restore_daemon_bind"]
    assert r["rc"] == 0, r["stderr"]
    assert r["drivers_after"][LONE] == "e1000e"
    assert run["override_after_restore"] in ("", "(null)")


def test_dra_publishes_vfio_driver_and_on_prepare_binds_the_variant(run: dict[str, Any]) -> None:
    d = run["dra"]
    assert "crash" not in d, d["crash"]
    assert d["published"] is not None, d
    # an onPrepare group still on e1000e: the slice says which driver Prepare will bind
    assert d["published"]["attributes"]["vfioDriver"] == {"string": VARIANT}, d["published"]
    assert d["driver_published"] == "e1000e"
    assert d["prepare"]["error"] == "", d["prepare"]
    assert d["driver_prepared"] == VARIANT and d["override_prepared"] == VARIANT
    node = f"/dev/vfio/{run['groups_of'][LONE]}"
    assert d["node_prepared"] and d["cdi_nodes"] == ["/dev/vfio/vfio", node], d["cdi_nodes"]
    assert list(d["unprepare"].values()) == [""], d["unprepare"]
    assert d["driver_unprepared"] == "e1000e"
    assert d["override_unprepared"] in ("", "(null)")
    assert "cleanup" not in run, run["cleanup"]


def test_a_variant_bound_by_hand_is_ready_and_never_rebound(run: dict[str, Any]) -> None:
    assert run["by_hand_variant"] == VARIANT
    (rep,) = json.loads(run["check_by_hand_variant"]["stdout"])
    assert rep["ready"] and rep["vfio_driver"] == VARIANT, rep
    out = json.loads(run["bind_by_hand_variant"]["stdout"])
    assert out["already"] == [LONE] and out["bound"] == []


def test_a_vendor_provider_is_ready_handed_out_and_never_rebound(run: dict[str, Any]) -> None:
    assert run["modprobe_provider"]["rc"] == 0, run["modprobe_provider"]
    assert run["provider_driver"] == PROVIDER and run["provider_node"]
    (rep,) = json.loads(run["check_provider"]["stdout"])
    assert rep["ready"] and rep["vfio_driver"] == PROVIDER, rep
    groups = {g["group"]: g for g in json.loads(run["groups_provider"]["stdout"])}
    assert groups[int(run["groups_of"][LONE2])]["kernel_viable"] is True
    out = json.loads(run["bind_provider"]["stdout"])
    assert out["already"] == [LONE2] and out["bound"] == []
    # unbind --all gives back only what vfio_dp recorded: neither hand-bound device
    assert run["unbind_all"]["rc"] == 0, run["unbind_all"]["stderr"]
    assert run["unbind_all"]["drivers_after"] == {LONE: VARIANT, LONE2: PROVIDER}
