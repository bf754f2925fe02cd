"""A throwaway Linux guest with a real (emulated) Intel IOMMU, for tests and benchmarks.

Boots Debian's stock kernel under QEMU software emulation (``-accel tcg``; never KVM) on a q35
machine with ``intel-iommu,intremap=on`` and emulated PCI NICs, mounts THIS machine's root file
system read-only over 9p with a throwaway tmpfs overlay on top, and runs a shell script inside a
chroot of it -- with the same Python interpreter (``sys.executable``) and the same checkout as
outside. Anything the script does to ``/sys`` (binding, unbinding, ...) happens to the guest's
kernel only; the host's root is exported read-only.

Default PCI topology (see :class:`Topology`)::

    0000:01:00.0, 0000:02:00.0  8086:10d3 e1000e, each alone in its IOMMU group (clean case)
    0000:03:01.0, 0000:03:02.0  8086:100e e1000, sharing a group with the PCIe-to-PCI bridge
                                (1b36:000e) -- the "group not viable" case

Usage (stdlib only; works from pytest, bench scripts, or the command line)::

    from tests.guest.rig import run_in_guest, run_many
    res = run_in_guest("python3 -c 'import sys; print(sys.version)'", timeout=120)
    print(res.returncode, res.stdout)
    results = run_many({"a": "ls /sys/kernel/iommu_groups", "b": "lspci -n"})  # ONE boot

    python3 tests/guest/rig.py -c 'ls -l /sys/bus/pci/devices'    # command-line use

Inside the guest: cwd is the checkout root, ``PATH`` starts with the directory of
``sys.executable`` (and of installed console scripts), ``$PYTHON`` is ``sys.executable``,
``GUEST_RIG=1`` and ``VFIO_DP_GUEST=1`` are set, ``$GUEST_RIG_OUT`` is a directory whose files
come back in :attr:`GuestResult.files`. ``/tmp``, ``/run``, ``/dev/shm`` are fresh tmpfs (the
host's files there are NOT visible), except the checkout itself and, if they live there, the
interpreter's venv and the kernel's module tree: these are exported on their own and mounted at
their own paths on top (:func:`guest_shares`), so a clone may live anywhere, cgroup2 is mounted at ``/sys/fs/cgroup``, the guest kernel's
full module tree is at ``/lib/modules/$(uname -r)`` so ``modprobe`` works.

Environment knobs: ``VFIO_DP_CACHE`` (cache root, default ``~/.cache/vfio_dp``; kernel and
initrd go to ``$VFIO_DP_CACHE/guest/<kernel-version>/``), ``VFIO_DP_GUEST_KERNEL`` (pin a kernel
version such as ``6.1.0-56-amd64``), ``VFIO_DP_GUEST_BOOT_TIMEOUT`` (seconds, default 120),
``VFIO_DP_GUEST_KEEP=1`` (keep the per-run work directory for debugging), ``VFIO_DP_QEMU``
(path of qemu-system-x86_64).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

__all__ = [
    "DEFAULT_MODULES",
    "DEFAULT_TOPOLOGY",
    "MODULES_SRC",
    "GuestBootError",
    "GuestResult",
    "GuestRig",
    "GuestRigError",
    "GuestRigUnavailable",
    "GuestRunError",
    "KernelAssets",
    "Topology",
    "build_modules",
    "ensure_initrd",
    "ensure_kernel",
    "find_qemu",
    "guest_shares",
    "in_guest",
    "repo_root",
    "run_in_guest",
    "run_many",
]

#: Bump when the cache layout or the generated /init changes incompatibly.
RIG_FORMAT = 1

#: Modules the initramfs itself needs (to reach the 9p root and overlay it). Their dependencies
#: (virtio, virtio_ring, virtio_pci_{modern,legacy}_dev, 9pnet, netfs, fscache) are resolved from
#: modules.dep.
BOOT_MODULES: tuple[str, ...] = ("virtio_pci", "9pnet_virtio", "9p", "overlay")

#: Modules loaded (with dependencies: vfio, vfio_virqfd, irqbypass, vfio_pci_core) before the
#: script runs. Pass ``modules=("e1000e", "e1000")`` to exercise "vfio-pci not loaded yet" paths.
DEFAULT_MODULES: tuple[str, ...] = ("e1000e", "e1000", "vfio_pci", "vfio_iommu_type1")

#: ``no_timer_check``: under TCG on a loaded host the kernel's IO-APIC timer check can fail
#: ("timer doesn't work through Interrupt-remapped IO-APIC") and panic the boot; a VM's
#: kernel skips it (as cloud images do)
KERNEL_CMDLINE = (
    "console=ttyS0 panic=-1 edd=off intel_iommu=on iommu=pt quiet no_timer_check guestrig=1"
)
GUEST_RESULTS_DIR = "/run/guest-rig"  # where the results share appears inside the chroot
_MSIZE = 262144
_STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# --------------------------------------------------------------------------------------------
# errors and results


class GuestRigError(Exception):
    """Base class of every guest-rig error."""


class GuestRigUnavailable(GuestRigError):
    """QEMU, the kernel or a tool needed to build the guest cannot be had on this machine."""


class GuestBootError(GuestRigError):
    """QEMU started but the guest never became ready to run scripts."""

    def __init__(self, message: str, console: str = "") -> None:
        super().__init__(f"{message}\n--- guest console (tail) ---\n{_tail(console)}")
        self.console = console


class GuestRunError(GuestRigError):
    """The guest booted but a script timed out, or the guest/QEMU died before finishing."""

    def __init__(
        self,
        message: str,
        console: str = "",
        results: Mapping[str, GuestResult] | None = None,
        partial: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{message}\n--- guest console (tail) ---\n{_tail(console)}")
        self.console = console
        #: Results of the scripts that did finish (run_many), keyed by name.
        self.results: dict[str, GuestResult] = dict(results or {})
        #: What the scripts that did NOT finish had written (stdout, then stderr), by name.
        self.partial: dict[str, str] = dict(partial or {})


@dataclasses.dataclass(frozen=True)
class GuestResult:
    """Outcome of one script run inside the guest."""

    name: str
    returncode: int
    stdout: str
    stderr: str
    #: Serial console log of the whole boot (shared by every script of one boot).
    console: str
    #: Wall time of the script itself, measured inside the guest (seconds).
    elapsed: float
    #: Host wall time from starting QEMU until the guest was ready to run scripts.
    boot_elapsed: float
    #: Host wall time of the whole QEMU run this script was part of.
    total_elapsed: float
    #: Files the script left in ``$GUEST_RIG_OUT`` (relative path -> content).
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)

    def check(self) -> GuestResult:
        """Return self if the script exited 0, else raise :class:`AssertionError` with output."""
        if self.returncode != 0:
            raise AssertionError(
                f"guest script {self.name!r} exited {self.returncode}\n"
                f"--- stdout ---\n{_tail(self.stdout)}\n--- stderr ---\n{_tail(self.stderr)}"
            )
        return self


_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[A-Za-z]|[@-Z\\-_c])")


def _tail(text: str, lines: int = 60) -> str:
    """Last ``lines`` non-blank lines, without terminal escape sequences."""
    kept = [ln.rstrip() for ln in _ANSI.sub("", text).replace("\r", "").splitlines()]
    return "\n".join([ln for ln in kept if ln.strip()][-lines:])


# --------------------------------------------------------------------------------------------
# topology


@dataclasses.dataclass(frozen=True)
class Topology:
    """Emulated PCI devices.

    ``lone_e1000e`` e1000e NICs (8086:10d3), each behind its own pcie-root-port, hence each alone
    in its IOMMU group, at ``0000:01:00.0``, ``0000:02:00.0``, ... ; then, if ``shared_e1000`` > 0,
    one pcie-pci-bridge (1b36:000e) with that many e1000 NICs (8086:100e) behind it, all in ONE
    group with the bridge, at ``0000:<lone_e1000e+1>:01.0``, ``...:02.0``, ...
    """

    lone_e1000e: int = 2
    shared_e1000: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.lone_e1000e <= 16 or not 0 <= self.shared_e1000 <= 16:
            raise ValueError(f"unsupported topology {self}")

    @property
    def lone_addresses(self) -> tuple[str, ...]:
        return tuple(f"0000:{i:02x}:00.0" for i in range(1, self.lone_e1000e + 1))

    @property
    def bridge_bus(self) -> int:
        return self.lone_e1000e + 1

    @property
    def shared_addresses(self) -> tuple[str, ...]:
        bus = self.bridge_bus
        return tuple(f"0000:{bus:02x}:{j:02x}.0" for j in range(1, self.shared_e1000 + 1))

    def qemu_args(self) -> list[str]:
        args: list[str] = []
        for i in range(1, self.lone_e1000e + 1):
            args += ["-device", f"pcie-root-port,id=rp{i},chassis={i}"]
            args += ["-device", f"e1000e,bus=rp{i}"]
        if self.shared_e1000:
            args += ["-device", "pcie-pci-bridge,id=br1,bus=pcie.0"]
            for j in range(1, self.shared_e1000 + 1):
                args += ["-device", f"e1000,bus=br1,addr={j}"]
        return args


DEFAULT_TOPOLOGY = Topology()


# --------------------------------------------------------------------------------------------
# paths and host tools


def repo_root() -> Path:
    """The checkout root (this file is ``<root>/tests/guest/rig.py``)."""
    return Path(os.path.realpath(__file__)).parents[2]


def cache_root() -> Path:
    base = os.environ.get("VFIO_DP_CACHE") or os.path.join(Path.home(), ".cache", "vfio_dp")
    return Path(base) / "guest"


def in_guest(cmdline: Path = Path("/proc/cmdline")) -> bool:
    """True when running inside a rig guest (safe place for real bind/unbind): the kernel
    command line (``cmdline``) carries the rig's own ``guestrig=1``."""
    try:
        return "guestrig=1" in cmdline.read_text().split()
    except OSError:
        return False


def find_qemu() -> str:
    """Path of qemu-system-x86_64, or raise :class:`GuestRigUnavailable`."""
    cand = os.environ.get("VFIO_DP_QEMU") or shutil.which("qemu-system-x86_64")
    if not cand or not os.access(cand, os.X_OK):
        raise GuestRigUnavailable(
            "qemu-system-x86_64 not found (install the Debian package qemu-system-x86, "
            "or set VFIO_DP_QEMU)"
        )
    return cand


def _which(tool: str, package: str) -> str:
    path = shutil.which(tool, path=_STD_PATH + ":" + os.environ.get("PATH", ""))
    if not path:
        raise GuestRigUnavailable(f"{tool} not found (install the Debian package {package})")
    return path


def _is_static_elf(path: str) -> bool:
    """True if ``path`` is an ELF executable without a PT_INTERP (i.e. statically linked)."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if len(ident) < 64 or ident[:4] != b"\x7fELF":
            return False
        bits64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if bits64:
            (phoff,) = struct.unpack_from(end + "Q", ident, 32)
            phentsize, phnum = struct.unpack_from(end + "HH", ident, 54)
        else:
            (phoff,) = struct.unpack_from(end + "I", ident, 28)
            phentsize, phnum = struct.unpack_from(end + "HH", ident, 42)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            (ptype,) = struct.unpack(end + "I", f.read(4))
            if ptype == 3:  # PT_INTERP
                return False
    return True


def _find_busybox() -> str:
    for cand in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox") or ""):
        if cand and os.path.isfile(cand) and _is_static_elf(cand):
            return cand
    raise GuestRigUnavailable(
        "a statically linked busybox was not found (install the Debian package busybox-static)"
    )


def _run_tool(
    cmd: Sequence[str], *, what: str, cwd: str | None = None, timeout: float = 900
) -> str:
    try:
        proc = subprocess.run(
            list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GuestRigUnavailable(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        raise GuestRigUnavailable(
            f"{what} failed (exit {proc.returncode}): {shlex.join(cmd)}\n{proc.stderr.strip()}"
        )
    return proc.stdout


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# kernel


@dataclasses.dataclass(frozen=True)
class KernelAssets:
    """An extracted Debian kernel in the cache."""

    version: str  # e.g. "6.1.0-56-amd64" (= `uname -r` in the guest)
    directory: Path  # $VFIO_DP_CACHE/guest/<version>
    vmlinuz: Path
    #: Root of the module tree: ``modules_base/lib/modules/<version>/`` (depmod'ed).
    modules_base: Path

    @property
    def module_dir(self) -> Path:
        return self.modules_base / "lib" / "modules" / self.version


def _version_key(v: str) -> list[tuple[int, str]]:
    return [(int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-+~]", v)]


def _cached_versions(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if (p / "manifest.json").is_file()]
    return sorted(found, key=_version_key)


def _load_assets(directory: Path) -> KernelAssets:
    manifest = json.loads((directory / "manifest.json").read_text())
    return KernelAssets(
        version=str(manifest["version"]),
        directory=directory,
        vmlinuz=directory / "vmlinuz",
        modules_base=directory / "root",
    )


def _apt_stamp() -> list[int]:
    stamp = []
    for p in ("/var/lib/apt/lists", "/var/cache/apt/pkgcache.bin", "/etc/apt/sources.list.d"):
        try:
            stamp.append(os.stat(p).st_mtime_ns)
        except OSError:
            stamp.append(0)
    return stamp


def _apt_candidate_version(root: Path) -> str:
    """Kernel version that linux-image-amd64 depends on (memoised until apt's lists change)."""
    memo = root / "candidate.json"
    stamp = _apt_stamp()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = json.loads(memo.read_text())
        if data["stamp"] == stamp:
            return str(data["version"])
    out = _run_tool(
        ["apt-cache", "depends", "linux-image-amd64"], what="apt-cache depends", timeout=60
    )
    m = re.search(r"Depends:\s*linux-image-(\d\S*)", out)
    if not m:
        raise GuestRigUnavailable(f"cannot resolve linux-image-amd64's kernel package:\n{out}")
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".candidate.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"stamp": stamp, "version": m.group(1)}) + "\n")
        os.replace(tmp, memo)
    return m.group(1)


def ensure_kernel(version: str | None = None) -> KernelAssets:
    """Download (once) and cache Debian's amd64 kernel; return its cached assets.

    ``version`` (or env ``VFIO_DP_GUEST_KERNEL``) pins a version like ``6.1.0-56-amd64``;
    otherwise the candidate that ``linux-image-amd64`` depends on is used (resolved with
    ``apt-cache``, which is local and fast). If that cannot be downloaded but some kernel is
    already cached, the newest cached one is used.
    """
    root = cache_root()
    version = version or os.environ.get("VFIO_DP_GUEST_KERNEL") or None
    if version:
        version = version.removeprefix("linux-image-")
    if version and (root / version / "manifest.json").is_file():
        return _load_assets(root / version)
    cached = _cached_versions(root)
    try:
        wanted = version or _apt_candidate_version(root)
    except GuestRigUnavailable:
        if cached:
            return _load_assets(root / cached[-1])
        raise
    if (root / wanted / "manifest.json").is_file():
        return _load_assets(root / wanted)
    with _locked(root):
        if (root / wanted / "manifest.json").is_file():  # built meanwhile by someone else
            return _load_assets(root / wanted)
        try:
            return _build_kernel(root, wanted)
        except GuestRigUnavailable:
            if cached and not version:
                return _load_assets(root / cached[-1])
            raise


def _build_kernel(root: Path, version: str) -> KernelAssets:
    _which("dpkg-deb", "dpkg")
    _which("apt-get", "apt")
    depmod = _which("depmod", "kmod")
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{version}-", dir=root))
    try:
        dl = tmp / "dl"
        dl.mkdir()
        pkg = f"linux-image-{version}"
        _run_tool(
            ["apt-get", "-o", "APT::Sandbox::User=root", "download", pkg],
            what=f"apt-get download {pkg}",
            cwd=str(dl),
        )
        debs = sorted(dl.glob("linux-image-*.deb"))
        if not debs:
            raise GuestRigUnavailable(f"apt-get download {pkg} produced no .deb")
        x = tmp / "x"
        _run_tool(["dpkg-deb", "-x", str(debs[0]), str(x)], what="dpkg-deb -x")
        vmlinuz = x / "boot" / f"vmlinuz-{version}"
        if not vmlinuz.is_file():
            raise GuestRigUnavailable(f"{debs[0].name} has no boot/vmlinuz-{version}")
        src_mods = next(
            (
                p
                for p in (x / "lib/modules" / version, x / "usr/lib/modules" / version)
                if p.is_dir()
            ),
            None,
        )
        if src_mods is None:
            raise GuestRigUnavailable(f"{debs[0].name} has no lib/modules/{version}")
        os.replace(vmlinuz, tmp / "vmlinuz")
        (tmp / "root/lib/modules").mkdir(parents=True)
        os.replace(src_mods, tmp / "root/lib/modules" / version)
        shutil.rmtree(x)
        shutil.rmtree(dl)
        _run_tool([depmod, "-b", str(tmp / "root"), version], what="depmod")
        (tmp / "manifest.json").write_text(
            json.dumps({"version": version, "package": debs[0].name, "format": RIG_FORMAT}) + "\n"
        )
        final = root / version
        os.chmod(tmp, 0o755)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _load_assets(final)


# --------------------------------------------------------------------------------------------
# initramfs

_INIT_TEMPLATE = r"""#!/bin/busybox sh
# /init of the guest rig's initramfs (generated by tests/guest/rig.py)
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
KVER=@KVER@
say() { echo "guest-rig: $*"; }
die() {
    say "FATAL: $*"
    [ -d /results ] && echo "$*" > /results/fatal
    sync
    poweroff -f
    sleep 30
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
for m in @BOOT_MODULES@; do
    modprobe "$m" || die "modprobe $m"
done
mkdir -p /results /ro /rw /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=@MSIZE@ results /results \
    || die "cannot mount the results share"
. /results/config.sh || die "cannot read /results/config.sh"
mount -t 9p -o "trans=virtio,version=9p2000.L,ro,msize=@MSIZE@$ROOT_9P_OPTS" hostroot /ro \
    || die "cannot mount the host root share"
mount -t tmpfs -o mode=0755 rw /rw || die "tmpfs /rw"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/ro,upperdir=/rw/upper,workdir=/rw/work /host \
    || die "cannot mount the overlay root"
for d in proc sys dev; do
    mount -o bind "/$d" "/host/$d" || die "bind /$d"
done
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /host/dev/pts || say "warning: devpts"
mount -t tmpfs -o mode=1777 shm /host/dev/shm || say "warning: /dev/shm"
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup || say "warning: cgroup2"
mount -t tmpfs -o mode=1777 tmp /host/tmp || die "tmpfs /tmp"
mount -t tmpfs -o mode=0755 run /host/run || die "tmpfs /run"
# The checkout (and, when they live under /tmp, /run or /dev/shm, the venv and the kernel
# module tree) are shared explicitly and mounted at their own paths AFTER the tmpfs mounts
# above, which would hide them: a clone may live anywhere. Each gets its own throwaway
# overlay, like the root. config.sh sets SHARES=<n> and SHARE_0..SHARE_<n-1> (host paths).
i=0
while [ "$i" -lt "${SHARES:-0}" ]; do
    eval "p=\$SHARE_$i"
    mkdir -p "/share$i" "/rw/share$i/upper" "/rw/share$i/work" "/host$p" \
        || die "cannot make the mount point for $p"
    mount -t 9p -o "trans=virtio,version=9p2000.L,ro,msize=@MSIZE@" "share$i" "/share$i" \
        || die "cannot mount the share of $p"
    mount -t overlay overlay \
        -o "lowerdir=/share$i,upperdir=/rw/share$i/upper,workdir=/rw/share$i/work" "/host$p" \
        || die "cannot mount the overlay of $p"
    i=$((i + 1))
done
mkdir -p /host@GUEST_RESULTS@
mount -o bind /results /host@GUEST_RESULTS@ || die "bind results"
# the guest kernel's full module tree, inside the chroot (for modprobe, driverctl, ...) and in
# the initramfs (for the kernel's own request_module(), which runs /sbin/modprobe from here)
mkdir -p "/host$GUEST_MODDIR"
mount -o bind "/host$MODTREE" "/host$GUEST_MODDIR" || die "bind modules into the chroot"
mount -o bind "/host$MODTREE" "/lib/modules/$KVER" || die "bind modules into the initramfs"
for m in $MODULES; do
    modprobe "$m" || die "modprobe $m"
done
cat /proc/uptime > /results/ready
say "ready"
env -i /bin/busybox chroot /host /bin/sh @GUEST_RESULTS@/runner.sh
echo "$?" > /results/runner.rc
sync
say "poweroff"
poweroff -f
sleep 30
"""

_RUNNER = r"""#!/bin/sh
# runs inside the chroot (the host's /bin/sh); generated by tests/guest/rig.py
R=@GUEST_RESULTS@
. "$R/env.sh"
if command -v bash >/dev/null 2>&1; then SH=bash; else SH=sh; fi
for d in "$R"/jobs/*; do
    [ -f "$d/script.sh" ] || continue
    t=$(cat "$d/timeout")
    echo "guest-rig: job $(basename "$d") start" > /dev/console
    s=$(date +%s.%N)
    (
        cd "$GUEST_RIG_REPO" || exit 125
        export GUEST_RIG_OUT="$d/out"
        exec timeout -k 10 "$t" "$SH" "$d/script.sh"
    ) </dev/null >"$d/stdout" 2>"$d/stderr"
    rc=$?
    e=$(date +%s.%N)
    echo "$s $e" > "$d/times"
    echo "$rc" > "$d/rc"
    echo "guest-rig: job $(basename "$d") exit $rc" > /dev/console
done
sync
echo done > "$R/done"
"""


def _parse_modules_dep(module_dir: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (relative path, [dependency names]) from modules.dep (names normalised to _)."""
    deps: dict[str, tuple[str, list[str]]] = {}
    for line in (module_dir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        path, _, rest = line.partition(":")
        deps[_modname(path)] = (path, [_modname(d) for d in rest.split()])
    return deps


def _modname(path: str) -> str:
    base = os.path.basename(path)
    for suffix in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.replace("-", "_")


def _module_closure(module_dir: Path, wanted: Sequence[str]) -> list[str]:
    """Relative paths of ``wanted`` modules and their dependencies, dependencies first."""
    deps = _parse_modules_dep(module_dir)
    builtin = {
        _modname(line.strip())
        for line in (module_dir / "modules.builtin").read_text().splitlines()
        if line.strip()
    }
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name not in deps:
            if name in builtin:
                return
            raise GuestRigUnavailable(f"kernel module {name} not found in {module_dir}")
        for dep in deps[name][1]:
            visit(dep)
        order.append(deps[name][0])

    for name in wanted:
        visit(name.replace("-", "_"))
    return order


def _copy_module(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    name = src.name
    if name.endswith(".ko"):
        shutil.copyfile(src, dst)
    elif name.endswith(".ko.xz"):
        import lzma

        dst.with_name(name[:-3]).write_bytes(lzma.decompress(src.read_bytes()))
    elif name.endswith(".ko.gz"):
        import gzip

        dst.with_name(name[:-3]).write_bytes(gzip.decompress(src.read_bytes()))
    elif name.endswith(".ko.zst"):
        zstd = _which("zstd", "zstd")
        out = subprocess.run([zstd, "-dc", str(src)], capture_output=True, check=True).stdout
        dst.with_name(name[:-4]).write_bytes(out)
    else:
        raise GuestRigUnavailable(f"unknown module format: {src}")


def _init_script(kernel: KernelAssets) -> str:
    return (
        _INIT_TEMPLATE.replace("@KVER@", kernel.version)
        .replace("@BOOT_MODULES@", " ".join(BOOT_MODULES))
        .replace("@MSIZE@", str(_MSIZE))
        .replace("@GUEST_RESULTS@", GUEST_RESULTS_DIR)
    )


#: the sources of the rig's own kernel modules (a VFIO variant driver, a vendor stand-in)
MODULES_SRC = Path(__file__).resolve().parent / "modules"


def build_modules(release: str, source: Path = MODULES_SRC) -> Path:
    """Build the out-of-tree kernel modules of ``source`` (its ``Kbuild``) for the guest
    kernel ``release`` (``6.1.0-56-amd64``) against Debian's
    ``/usr/src/linux-headers-<release>`` (package ``linux-headers-<release>``, installed by
    scripts/setup.sh); returns the directory holding the ``.ko`` files. Built once per
    source content and kept under the cache (no binary is committed); the one module
    builder of the rig. Raises :class:`GuestRigUnavailable` without the headers or a
    compiler."""
    headers = Path("/usr/src") / f"linux-headers-{release}"
    if not (headers / "Makefile").is_file():
        raise GuestRigUnavailable(
            f"{headers} is missing: install linux-headers-{release} (scripts/setup.sh does)"
        )
    files = sorted(p for p in source.iterdir() if p.is_file() and p.suffix in (".c", ".h", ""))
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    out = cache_root() / "modules" / release / digest.hexdigest()[:16]
    if any(out.glob("*.ko")):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent):
        if any(out.glob("*.ko")):
            return out
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
        try:
            for f in files:
                shutil.copy2(f, work / f.name)
            _run_tool(
                [_which("make", "make"), "-C", str(headers), f"M={work}", "modules"],
                what=f"building {source.name} against linux-headers-{release}",
                timeout=600,
            )
            kos = sorted(work.glob("*.ko"))
            if not kos:
                raise GuestRigUnavailable(f"make built no .ko in {work}")
            done = Path(tempfile.mkdtemp(prefix=".done-", dir=out.parent))
            os.chmod(done, 0o755)
            for ko in kos:
                shutil.copy2(ko, done / ko.name)
            os.replace(done, out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def ensure_initrd(kernel: KernelAssets) -> Path:
    """Build (once, atomically) the initramfs for ``kernel``; return its path."""
    init = _init_script(kernel)
    busybox = _find_busybox()
    key = hashlib.sha256(
        f"{RIG_FORMAT}\n{init}\n{os.path.getsize(busybox)}\n".encode()
    ).hexdigest()[:16]
    target = kernel.directory / f"initrd-{key}.cpio"
    if target.is_file():
        return target
    cpio = _which("cpio", "cpio")
    depmod = _which("depmod", "kmod")
    with _locked(kernel.directory):
        if target.is_file():
            return target
        stage = Path(tempfile.mkdtemp(prefix=".initrd-", dir=kernel.directory))
        try:
            for d in ("bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "etc", "tmp"):
                (stage / d).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(busybox, stage / "bin/busybox")
            os.chmod(stage / "bin/busybox", 0o755)
            mdir = stage / "lib/modules" / kernel.version
            for rel in _module_closure(kernel.module_dir, BOOT_MODULES):
                _copy_module(kernel.module_dir / rel, mdir / rel)
            for meta in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
                if (kernel.module_dir / meta).is_file():
                    shutil.copyfile(kernel.module_dir / meta, mdir / meta)
            _run_tool([depmod, "-b", str(stage), kernel.version], what="depmod (initrd)")
            (stage / "init").write_text(init)
            os.chmod(stage / "init", 0o755)
            files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
            tmp_out = kernel.directory / f".{target.name}.{os.getpid()}.tmp"
            with open(tmp_out, "wb") as out:
                subprocess.run(
                    [cpio, "-o", "-H", "newc", "--quiet", "-R", "0:0"],
                    input=("\n".join([".", *files]) + "\n").encode(),
                    stdout=out,
                    cwd=stage,
                    check=True,
                )
            os.replace(tmp_out, target)
        except subprocess.CalledProcessError as exc:
            raise GuestRigUnavailable(f"building the initramfs failed: {exc}") from exc
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return target


# --------------------------------------------------------------------------------------------
# running


#: Where the guest mounts fresh tmpfs over the host's root share: host paths below these are
#: invisible inside the guest unless shared explicitly (see :func:`guest_shares`).
GUEST_TMPFS_DIRS: tuple[str, ...] = ("/tmp", "/run", "/dev/shm")


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def guest_shares(module_tree: Path | None = None) -> list[str]:
    """Host directories exported to the guest on their own and mounted at the same path.

    Always the checkout (so a clone works wherever it lives, its ``.venv`` included); also
    the interpreter's prefix (a venv outside the checkout), its base installation and the
    kernel's module tree when they lie under :data:`GUEST_TMPFS_DIRS`, which the guest covers
    with fresh tmpfs. Real paths (symlinks resolved), parents before children, none inside
    another. A path with a newline cannot be shared (QEMU and the shell script would both
    misread it): :class:`GuestRigUnavailable` names it.
    """
    wanted = [str(repo_root())]
    candidates = [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)]
    if module_tree is not None:
        candidates.append(str(module_tree))
    for cand in candidates:
        real = os.path.realpath(cand)
        if any(_under(real, top) for top in GUEST_TMPFS_DIRS):
            wanted.append(real)
    shares: list[str] = []
    for path in sorted(wanted, key=lambda p: (p.count("/"), p)):
        if "\n" in path:
            raise GuestRigUnavailable(f"cannot share {path!r} with the guest: it has a newline")
        if not any(_under(path, s) for s in shares):
            shares.append(path)
    return shares


def _qemu_opt(value: str) -> str:
    """A value inside a QEMU ``-virtfs`` option list (a comma is written twice)."""
    return value.replace(",", ",,")


def _guest_path() -> str:
    dirs: list[str] = []
    for d in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        if d and d not in dirs:
            dirs.append(d)
    return ":".join([*dirs, _STD_PATH])


def _guest_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    root = str(repo_root())
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if (repo_root() / "src").is_dir():
        pythonpath.append(os.path.join(root, "src"))
    env = {
        "PATH": _guest_path(),
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "TERM": "dumb",
        "PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
        "GUEST_RIG": "1",
        "VFIO_DP_GUEST": "1",
        "GUEST_RIG_REPO": root,
    }
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.update(extra or {})
    return env


def _env_sh(env: Mapping[str, str]) -> str:
    lines = []
    for k, v in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"invalid environment variable name {k!r}")
        lines.append(f"export {k}={shlex.quote(v)}")
    return "\n".join(lines) + "\n"


def _boot_timeout() -> float:
    return float(os.environ.get("VFIO_DP_GUEST_BOOT_TIMEOUT", "120"))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@dataclasses.dataclass
class GuestRig:
    """A configured guest. Each :meth:`run_many` / :meth:`run` call is one fresh boot."""

    topology: Topology = DEFAULT_TOPOLOGY
    modules: Sequence[str] = DEFAULT_MODULES
    memory_mb: int = 2048
    smp: int = 2
    boot_timeout: float = dataclasses.field(default_factory=_boot_timeout)
    kernel_version: str | None = None
    #: Extra raw QEMU arguments (appended last).
    extra_qemu_args: Sequence[str] = ()
    #: Keep the per-run work directory (also env VFIO_DP_GUEST_KEEP=1).
    keep: bool = False
    _assets: tuple[KernelAssets, Path] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def prepare(self) -> tuple[KernelAssets, Path]:
        """Make sure QEMU, the kernel and the initramfs exist; else raise GuestRigUnavailable."""
        if self._assets is None:
            find_qemu()
            kernel = ensure_kernel(self.kernel_version)
            self._assets = (kernel, ensure_initrd(kernel))
        return self._assets

    def qemu_command(self, kernel: KernelAssets, initrd: Path, workdir: Path) -> list[str]:
        return [
            find_qemu(),
            "-accel", "tcg",
            "-machine", "q35",
            "-cpu", "max",
            "-m", str(self.memory_mb),
            "-smp", str(self.smp),
            "-device", "intel-iommu,intremap=on",
            "-kernel", str(kernel.vmlinuz),
            "-initrd", str(initrd),
            "-append", KERNEL_CMDLINE,
            "-nographic",
            "-no-reboot",
            "-net", "none",
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs",
            f"local,path={_qemu_opt(str(workdir))},mount_tag=results,security_model=none",
            *self._share_args(kernel),
            *self.topology.qemu_args(),
            *self.extra_qemu_args,
        ]  # fmt: skip

    @staticmethod
    def _share_args(kernel: KernelAssets) -> list[str]:
        args: list[str] = []
        for i, path in enumerate(guest_shares(kernel.module_dir)):
            args += [
                "-virtfs",
                f"local,path={_qemu_opt(path)},mount_tag=share{i},security_model=none,"
                "readonly=on,multidevs=remap",
            ]
        return args

    def run(
        self, script: str, *, timeout: float = 300, env: Mapping[str, str] | None = None
    ) -> GuestResult:
        """Boot once and run one script; see :meth:`run_many`."""
        return self.run_many({"script": script}, timeout=timeout, env=env)["script"]

    def run_many(
        self,
        scripts: Mapping[str, str],
        *,
        timeout: float = 300,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, GuestResult]:
        """Boot once and run each script in order (bash, cwd = checkout root); one result per name.

        ``timeout`` applies to each script. A script that exits non-zero is NOT an error (see
        :meth:`GuestResult.check`); a script that times out, or a guest that dies, raises
        :class:`GuestRunError` (with the finished scripts' results in ``.results``); a guest that
        never gets ready raises :class:`GuestBootError`; missing QEMU/kernel/tools raise
        :class:`GuestRigUnavailable`.
        """
        if not scripts:
            return {}
        kernel, initrd = self.prepare()
        workdir = Path(tempfile.mkdtemp(prefix="vfio-dp-guest-"))
        os.chmod(workdir, 0o755)
        keep = self.keep or os.environ.get("VFIO_DP_GUEST_KEEP") == "1"
        try:
            return self._run(kernel, initrd, workdir, scripts, timeout, env)
        finally:
            if keep:
                print(f"guest-rig: kept work directory {workdir}", file=sys.stderr)
            else:
                shutil.rmtree(workdir, ignore_errors=True)

    def _run(
        self,
        kernel: KernelAssets,
        initrd: Path,
        workdir: Path,
        scripts: Mapping[str, str],
        timeout: float,
        env: Mapping[str, str] | None,
    ) -> dict[str, GuestResult]:
        lib_modules = os.path.realpath("/lib") + "/modules"  # /lib -> usr/lib on merged-/usr
        config = {
            "KVER": kernel.version,
            "MODTREE": os.path.realpath(kernel.module_dir),
            "GUEST_MODDIR": f"{lib_modules}/{kernel.version}",
            "MODULES": " ".join(self.modules),
            "ROOT_9P_OPTS": "",
        }
        shares = guest_shares(kernel.module_dir)
        config["SHARES"] = str(len(shares))
        config.update({f"SHARE_{i}": path for i, path in enumerate(shares)})
        (workdir / "config.sh").write_text(_env_sh(config))
        (workdir / "env.sh").write_text(_env_sh(_guest_env(env)))
        (workdir / "runner.sh").write_text(_RUNNER.replace("@GUEST_RESULTS@", GUEST_RESULTS_DIR))
        jobs: list[tuple[str, Path]] = []
        for i, (name, script) in enumerate(scripts.items()):
            jd = workdir / "jobs" / f"{i:03d}"
            (jd / "out").mkdir(parents=True)
            (jd / "script.sh").write_text(script if script.endswith("\n") else script + "\n")
            (jd / "timeout").write_text(f"{timeout:g}\n")
            jobs.append((name, jd))

        console_path = workdir / "console.log"
        cmd = self.qemu_command(kernel, initrd, workdir)
        start = time.monotonic()
        ready_at: float | None = None
        deadline_run = len(jobs) * (timeout + 15) + 60
        with open(console_path, "wb") as console_f:
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=console_f, stderr=subprocess.STDOUT
                )
            except OSError as exc:
                raise GuestRigUnavailable(f"cannot start QEMU: {exc}") from exc
            try:
                while proc.poll() is None:
                    now = time.monotonic()
                    if ready_at is None and (workdir / "ready").exists():
                        ready_at = now
                    if ready_at is None and now - start > self.boot_timeout:
                        proc.kill()
                        proc.wait()
                        raise GuestBootError(
                            f"guest not ready after {self.boot_timeout:g}s "
                            f"(VFIO_DP_GUEST_BOOT_TIMEOUT); command: {shlex.join(cmd)}",
                            _read(console_path),
                        )
                    if ready_at is not None and now - ready_at > deadline_run:
                        proc.kill()
                        proc.wait()
                        raise GuestRunError(
                            f"guest still running {deadline_run:g}s after boot; killed QEMU",
                            _read(console_path),
                            self._collect(jobs, workdir, _read(console_path), 0.0, 0.0),
                            self._partial(jobs),
                        )
                    time.sleep(0.05)  # the poll period of this watch over QEMU
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        total = time.monotonic() - start
        console = _read(console_path)
        if ready_at is None and (workdir / "ready").exists():
            ready_at = start + total  # finished between two polls
        if ready_at is None:
            fatal = _read(workdir / "fatal").strip()
            raise GuestBootError(
                f"guest exited (QEMU status {proc.returncode}) before it was ready"
                + (f": {fatal}" if fatal else "")
                + f"; command: {shlex.join(cmd)}",
                console,
            )
        boot = ready_at - start
        results = self._collect(jobs, workdir, console, boot, total)
        if not (workdir / "done").exists():
            missing = [name for name, _ in jobs if name not in results]
            runner_rc = _read(workdir / "runner.rc").strip() or "?"
            raise GuestRunError(
                f"guest stopped before finishing (runner exit {runner_rc}, "
                f"QEMU status {proc.returncode}); scripts without a result: {missing}",
                console,
                results,
                self._partial(jobs),
            )
        timed_out = [
            name
            for name, _ in jobs
            if results[name].returncode in (124, 137) and results[name].elapsed >= timeout - 1
        ]
        if timed_out:
            details = "\n".join(
                f"--- {n}: stdout ---\n{_tail(results[n].stdout, 20)}\n"
                f"--- {n}: stderr ---\n{_tail(results[n].stderr, 20)}"
                for n in timed_out
            )
            raise GuestRunError(
                f"guest script(s) {timed_out} timed out after {timeout:g}s\n{details}",
                console,
                results,
            )
        return results

    @staticmethod
    def _partial(jobs: Sequence[tuple[str, Path]]) -> dict[str, str]:
        """Output so far of the scripts without an exit code (the guest stopped under them)."""
        return {
            name: _read(jd / "stdout") + _read(jd / "stderr")
            for name, jd in jobs
            if not _read(jd / "rc").strip()
        }

    @staticmethod
    def _collect(
        jobs: Sequence[tuple[str, Path]], workdir: Path, console: str, boot: float, total: float
    ) -> dict[str, GuestResult]:
        results: dict[str, GuestResult] = {}
        for name, jd in jobs:
            rc_text = _read(jd / "rc").strip()
            if not rc_text:
                continue
            try:
                s, e = (float(x) for x in _read(jd / "times").split())
                elapsed = e - s
            except ValueError:
                elapsed = float("nan")
            files: dict[str, bytes] = {}
            out = jd / "out"
            for p in sorted(out.rglob("*")) if out.is_dir() else []:
                if p.is_file():
                    files[str(p.relative_to(out))] = p.read_bytes()
            results[name] = GuestResult(
                name=name,
                returncode=int(rc_text),
                stdout=_read(jd / "stdout"),
                stderr=_read(jd / "stderr"),
                console=console,
                elapsed=elapsed,
                boot_elapsed=boot,
                total_elapsed=total,
                files=files,
            )
        return results


def run_many(
    scripts: Mapping[str, str],
    *,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    topology: Topology = DEFAULT_TOPOLOGY,
    modules: Sequence[str] = DEFAULT_MODULES,
) -> dict[str, GuestResult]:
    """Boot one guest and run several scripts in it, in order; see :meth:`GuestRig.run_many`."""
    return GuestRig(topology=topology, modules=modules).run_many(scripts, timeout=timeout, env=env)


def run_in_guest(
    script: str,
    *,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    topology: Topology = DEFAULT_TOPOLOGY,
    modules: Sequence[str] = DEFAULT_MODULES,
) -> GuestResult:
    """Boot one guest and run ``script`` (bash, cwd = checkout root) in it."""
    return GuestRig(topology=topology, modules=modules).run(script, timeout=timeout, env=env)


# --------------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a shell script in the IOMMU guest rig.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("-c", "--command", help="script text")
    src.add_argument("-f", "--file", help="script file ('-' = stdin)")
    src.add_argument("--prepare", action="store_true", help="only download/build kernel+initrd")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--lone-e1000e", type=int, default=DEFAULT_TOPOLOGY.lone_e1000e)
    ap.add_argument("--shared-e1000", type=int, default=DEFAULT_TOPOLOGY.shared_e1000)
    ap.add_argument("--console", action="store_true", help="print the serial console log too")
    args = ap.parse_args(argv)
    rig = GuestRig(topology=Topology(args.lone_e1000e, args.shared_e1000))
    try:
        if args.prepare:
            t0 = time.monotonic()
            kernel, initrd = rig.prepare()
            print(f"kernel {kernel.version}: {kernel.vmlinuz}\ninitrd: {initrd}")
            print(f"took {time.monotonic() - t0:.1f}s")
            return 0
        if args.command is not None:
            script = args.command
        elif args.file == "-":
            script = sys.stdin.read()
        else:
            script = Path(args.file).read_text()
        res = rig.run(script, timeout=args.timeout)
    except GuestRigError as exc:
        print(f"guest-rig: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.console:
        sys.stderr.write(res.console)
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    print(
        f"guest-rig: exit {res.returncode}; script {res.elapsed:.1f}s, "
        f"boot {res.boot_elapsed:.1f}s, total {res.total_elapsed:.1f}s",
        file=sys.stderr,
    )
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
