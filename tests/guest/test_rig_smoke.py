"""Smoke test of the guest rig against the real kernel: groups, a clean bind, group viability.

All scripts run in ONE boot (module-scoped fixture); the tests assert on their results.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .rig import KERNEL_CMDLINE, GuestResult, in_guest, repo_root

if TYPE_CHECKING:
    from .conftest import Guest

pytestmark = pytest.mark.guest

LONE = "0000:01:00.0"
LONE2 = "0000:02:00.0"
SHARED_A = "0000:03:01.0"
SHARED_B = "0000:03:02.0"

# VFIO_GROUP_GET_STATUS = _IO(';', 100 + 3); struct vfio_group_status { u32 argsz; u32 flags; }
_STATUS_PY = r"""
import fcntl, os, struct, sys
fd = os.open("/dev/vfio/" + sys.argv[1], os.O_RDWR)
try:
    buf = bytearray(struct.pack("<II", 8, 0))
    fcntl.ioctl(fd, 0x3B67, buf)
    print(sys.argv[2] + "=" + str(struct.unpack("<II", buf)[1]))
finally:
    os.close(fd)
"""

SCRIPTS: dict[str, str] = {
    "python": r"""
python3 -c 'import sys; print(sys.version)'
echo "which=$(command -v python3)"
echo "PYTHON=$PYTHON"
echo "cwd=$(pwd)"
echo "kernel=$(uname -r)"
echo "cmdline=$(cat /proc/cmdline)"
"$PYTHON" -c 'from tests.guest.rig import in_guest; print("in_guest=%s" % in_guest())'
""",
    "exit_code": "echo to-stdout; echo to-stderr >&2; exit 3\n",
    "topology": r"""
set -eu
python3 - <<'EOF'
import json, os
def link(p):
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None
devs = {}
for bdf in sorted(os.listdir("/sys/bus/pci/devices")):
    p = "/sys/bus/pci/devices/" + bdf
    rd = lambda n: open(p + "/" + n).read().strip()
    devs[bdf] = {"vendor": rd("vendor"), "device": rd("device"), "class": rd("class"),
                 "driver": link(p + "/driver"), "group": link(p + "/iommu_group")}
groups = {g: sorted(os.listdir("/sys/kernel/iommu_groups/%s/devices" % g))
          for g in os.listdir("/sys/kernel/iommu_groups")}
with open(os.environ["GUEST_RIG_OUT"] + "/topology.json", "w") as f:
    json.dump({"devices": devs, "groups": groups}, f, indent=1)
EOF
echo ok
""",
    "bind_lone": rf"""
set -eux
A={LONE}
D=/sys/bus/pci/devices/$A
drv() {{ if [ -e "$D/driver" ]; then basename "$(readlink "$D/driver")"; else echo none; fi; }}
echo "before=$(drv)"
echo "override_before=$(cat "$D/driver_override")"
[ -d /sys/bus/pci/drivers/vfio-pci ] || modprobe vfio-pci
echo vfio-pci > "$D/driver_override"
if [ -e "$D/driver" ]; then echo "$A" > "$D/driver/unbind"; fi
echo "$A" > /sys/bus/pci/drivers_probe
echo "after=$(drv)"
G=$(basename "$(readlink "$D/iommu_group")")
echo "group=$G"
ls -l /dev/vfio/
if [ -c "/dev/vfio/$G" ]; then echo devnode=yes; else echo devnode=no; fi
python3 - "$G" status <<'EOF'
{_STATUS_PY}
EOF
# restore: clear the override, unbind from vfio-pci, re-probe
echo > "$D/driver_override"
echo "$A" > "$D/driver/unbind"
echo "$A" > /sys/bus/pci/drivers_probe
echo "restored=$(drv)"
echo "override_after=$(cat "$D/driver_override")"
if [ -e "/dev/vfio/$G" ]; then echo devnode_after=yes; else echo devnode_after=no; fi
""",
    "shared_group": rf"""
set -eux
A={SHARED_A}
B={SHARED_B}
drv() {{
    if [ -e "/sys/bus/pci/devices/$1/driver" ]; then
        basename "$(readlink "/sys/bus/pci/devices/$1/driver")"
    else echo none; fi
}}
G=$(basename "$(readlink "/sys/bus/pci/devices/$A/iommu_group")")
echo "group=$G"
for m in /sys/kernel/iommu_groups/$G/devices/*; do
    echo "member=$(basename "$m"):$(drv "$(basename "$m")")"
done
echo vfio-pci > "/sys/bus/pci/devices/$A/driver_override"
echo "$A" > "/sys/bus/pci/devices/$A/driver/unbind"
echo "$A" > /sys/bus/pci/drivers_probe
echo "a_after=$(drv "$A")"
python3 - "$G" one_bound <<'EOF'
{_STATUS_PY}
EOF
echo "$B" > "/sys/bus/pci/devices/$B/driver/unbind"
echo "b_after=$(drv "$B")"
python3 - "$G" sibling_unbound <<'EOF'
{_STATUS_PY}
EOF
echo > "/sys/bus/pci/devices/$A/driver_override"
echo "$A" > "/sys/bus/pci/devices/$A/driver/unbind"
echo "$A" > /sys/bus/pci/drivers_probe
echo "$B" > /sys/bus/pci/drivers_probe
echo "restored=$(drv "$A"),$(drv "$B")"
""",
}


def _kv(result: GuestResult) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in result.stdout.splitlines():
        m = re.fullmatch(r"([A-Za-z_]+)=(.*)", line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


@pytest.fixture(scope="module")
def smoke(guest: Guest) -> dict[str, GuestResult]:
    return guest.run_many(SCRIPTS, timeout=180)


@pytest.fixture(scope="module")
def topo(smoke: dict[str, GuestResult]) -> dict[str, Any]:
    res = smoke["topology"].check()
    data: dict[str, Any] = json.loads(res.files["topology.json"])
    return data


def test_in_guest_is_decided_by_the_rigs_kernel_argument(tmp_path: Path) -> None:
    """The marker that lets real binding run: only the rig's own ``guestrig=1`` word counts
    (the guest side is checked in test_same_python_and_checkout: ``in_guest`` is True there)."""
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(KERNEL_CMDLINE + "\n")  # what the rig boots with
    assert in_guest(cmdline)
    for other in ("console=ttyS0 quiet", "guestrig=10 x", "noguestrig=1", "guestrig=1x"):
        cmdline.write_text(other + "\n")
        assert not in_guest(cmdline), other
    assert not in_guest(tmp_path / "missing")


def test_same_python_and_checkout(smoke: dict[str, GuestResult], guest: Guest) -> None:
    res = smoke["python"].check()
    kv = _kv(res)
    assert res.stdout.splitlines()[0] == sys.version
    assert os.path.dirname(kv["which"]) == os.path.dirname(sys.executable)
    assert kv["PYTHON"] == sys.executable
    assert kv["cwd"] == str(repo_root())
    assert kv["kernel"] == guest.kernel.version
    assert "intel_iommu=on" in kv["cmdline"].split()
    assert kv["in_guest"] == "True"


def test_exit_code_and_streams(smoke: dict[str, GuestResult]) -> None:
    res = smoke["exit_code"]
    assert res.returncode == 3
    assert res.stdout == "to-stdout\n"
    assert res.stderr == "to-stderr\n"
    with pytest.raises(AssertionError, match="exited 3"):
        res.check()


def test_iommu_groups_exist(topo: dict[str, Any]) -> None:
    assert len(topo["groups"]) >= 4
    for bdf in (LONE, LONE2, SHARED_A, SHARED_B):
        group = topo["devices"][bdf]["group"]
        assert bdf in topo["groups"][group], (bdf, group, topo["groups"].get(group))


def test_lone_e1000e_alone_in_group(topo: dict[str, Any]) -> None:
    for bdf in (LONE, LONE2):
        dev = topo["devices"][bdf]
        assert (dev["vendor"], dev["device"], dev["driver"]) == ("0x8086", "0x10d3", "e1000e")
        assert topo["groups"][dev["group"]] == [bdf]


def test_shared_e1000_group_with_bridge(topo: dict[str, Any]) -> None:
    a, b = topo["devices"][SHARED_A], topo["devices"][SHARED_B]
    for dev in (a, b):
        assert (dev["vendor"], dev["device"], dev["driver"]) == ("0x8086", "0x100e", "e1000")
    assert a["group"] == b["group"]
    members = topo["groups"][a["group"]]
    assert len(members) == 3
    (bridge,) = set(members) - {SHARED_A, SHARED_B}
    assert (topo["devices"][bridge]["vendor"], topo["devices"][bridge]["device"]) == (
        "0x1b36",
        "0x000e",
    )


def test_clean_bind_sequence(smoke: dict[str, GuestResult], topo: dict[str, Any]) -> None:
    res = smoke["bind_lone"].check()
    kv = _kv(res)
    assert kv["before"] == "e1000e"
    assert kv["after"] == "vfio-pci"
    assert kv["group"] == topo["devices"][LONE]["group"]
    assert kv["devnode"] == "yes"
    assert int(kv["status"]) & 1, "VFIO_GROUP_GET_STATUS: group not viable"
    assert kv["restored"] == "e1000e"
    assert kv["override_after"] == "(null)"
    assert kv["devnode_after"] == "no"


def test_shared_group_viability(smoke: dict[str, GuestResult]) -> None:
    res = smoke["shared_group"].check()
    kv = _kv(res)
    assert kv["a_after"] == "vfio-pci"
    assert int(kv["one_bound"]) & 1 == 0, "sibling on e1000 must make the group not viable"
    assert kv["b_after"] == "none"
    assert int(kv["sibling_unbound"]) & 1 == 1
    assert kv["restored"] == "e1000,e1000"
