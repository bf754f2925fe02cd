#!/usr/bin/env bash
# Install everything vfio_dp needs on a fresh Debian 12 machine: system packages with
# apt-get, then the project (editable) with its test extra via pip. Idempotent.
# `--for wheel` / `--for image`: only what `make wheel` / `make image` need.
set -euo pipefail
cd "$(dirname "$0")/.."

# What each make target needs (scripts/setup.sh --for TARGET; --list prints it and exits):
#   all    everything: the tests, the guest rig, the demo (make setup, make test, make demo)
#   wheel  make wheel: a virtual environment that can build the package (no QEMU, libvirt or
#          vagrant packages; the wheel itself is pure Python)
#   image  make image: the image builder only (the image builds its own Python inside)
FOR=all
LIST=0
while [ $# -gt 0 ]; do
  case "$1" in
    --for) FOR=$2; shift 2 ;;
    --list) LIST=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print } /^FOR=all/ { exit }' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument $1 (--for all|wheel|image, --list)" >&2; exit 2 ;;
  esac
done

APT_WHEEL=(python3-venv)
APT_IMAGE=(
  # deploy/Containerfile built by scripts/build-image.sh; --debian-base makes its base from
  # Debian's packages (mmdebstrap) and imports it (podman): no registry at all
  buildah podman mmdebstrap
)
APT_ALL=(
  "${APT_WHEEL[@]}"
  # libvirt-python builds from source against these
  gcc pkg-config libvirt-dev python3-dev
  # real libvirt for XML checks (test:///default via libvirt-python; virt-xml-validate)
  libvirt-clients
  # the real-kernel guest rig: QEMU, a tiny init, depmod, initramfs packing
  qemu-system-x86 busybox-static kmod cpio
  # real libvirt's QEMU driver inside the guest (demo step 6)
  libvirt-daemon-system libvirt-daemon-driver-qemu
  # lspci + the names database (vfioctl list shows names; the benchmark compares with lspci)
  pciutils pci.ids
  # the tools people use today, compared side by side in the guest
  driverctl dpdk
  # the external fault injector of the crash tests (SIGKILL, ENOSPC, delays on sysfs writes)
  strace
  # bench/fleet.py row 4's closed loop: a C HTTP load generator (TLS, keep-alive, Lua)
  wrk
  # `vagrant validate` of the Vagrantfile with its real libvirt provider; shellcheck for its
  # provisioning script
  vagrant vagrant-libvirt shellcheck
  # building deploy/Containerfile in a test (tests/deploy/test_image_build.py)
  "${APT_IMAGE[@]}"
)
case "$FOR" in
  all) APT_PACKAGES=("${APT_ALL[@]}") ;;
  wheel) APT_PACKAGES=("${APT_WHEEL[@]}") ;;
  image) APT_PACKAGES=("${APT_IMAGE[@]}") ;;
  *) echo "setup.sh: --for $FOR: give all, wheel or image" >&2; exit 2 ;;
esac
if [ "$LIST" = 1 ]; then
  printf '%s\n' "${APT_PACKAGES[@]}"
  exit 0
fi

# the guest rig builds its own kernel modules (a VFIO variant driver, tests/guest/modules)
# against the guest kernel's headers: the release linux-image-amd64 depends on, as the rig
# boots it (tests/guest/rig.py ensure_kernel)
guest_release() {
  apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-//p' | head -n1 || true
}
if [ "$FOR" = all ]; then
  GUEST_RELEASE=$(guest_release)
  if [ -z "$GUEST_RELEASE" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # a fresh machine's package lists may be empty: apt-cache knows nothing before an update
    apt-get update -qq
    GUEST_RELEASE=$(guest_release)
  fi
  if [ -n "$GUEST_RELEASE" ]; then
    APT_PACKAGES+=("linux-headers-$GUEST_RELEASE")
    # the kernel's sample mdev driver mtty (samples/vfio-mdev/mtty.c) comes from the source
    # of that kernel series; the rig builds it like our own modules (tests/guest/mdev_rig.py)
    APT_PACKAGES+=("linux-source-$(echo "$GUEST_RELEASE" | cut -d. -f1,2)")
  else
    echo "setup: cannot tell the guest kernel's release (apt-cache depends linux-image-amd64):" \
      "the guest tests that build kernel modules will fail" >&2
  fi
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
else
  echo "setup: not root or no apt-get; install these yourself: ${APT_PACKAGES[*]}" >&2
fi

# The project lives in its own virtual environment (.venv): no root pip into the system
# interpreter, and no other package's start-up hooks (*.pth) on every `vfioctl` start —
# python start-up dominates a bind under emulation.
# Its interpreter is Debian's python3 (built with PGO and LTO): it starts and imports about
# a quarter faster than an unoptimised build such as pyenv's, which is first on PATH on some
# machines -- 0.4 s per vfioctl call in the emulated guest. VFIO_DP_PYTHON overrides it.
VENV=${VFIO_DP_VENV:-.venv}
PY=${VFIO_DP_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
want_home=$(dirname "$("$PY" -c 'import os, sys; print(os.path.realpath(sys.executable))')")
if [ -f "$VENV/pyvenv.cfg" ] && ! grep -qx "home = $want_home" "$VENV/pyvenv.cfg" 2>/dev/null; then
  echo "setup: recreating $VENV on $PY"
  rm -rf -- "$VENV"
fi
if [ "$FOR" = image ]; then
  exit 0  # the image builds its own Python environment inside (deploy/Containerfile)
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
if [ "$FOR" = wheel ]; then
  exit 0  # pip wheel fetches the build backend itself; no test extra, no libvirt-python
fi
# compat mode: a plain path entry, not an import-hook finder run at every interpreter start
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' \
  --config-settings editable_mode=compat

# Byte-compile now: the QEMU guest sees this checkout through a fresh overlay at every boot and
# would otherwise recompile every module at every interpreter start (seconds under emulation).
"$VENV/bin/python" -m compileall -q -j 0 vfio_dp vm_translate cli demo tests bench >/dev/null
