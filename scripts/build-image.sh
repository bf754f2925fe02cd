#!/usr/bin/env bash
# Build the vfio-dp image (deploy/Containerfile) and write it as ONE OCI archive file that any
# node can load without a registry (docs/install.md: containerd, CRI-O, k3s).
#
#   scripts/build-image.sh                      # base: the official python:3.11-slim-bookworm
#   scripts/build-image.sh --debian-base        # base made here from Debian's packages
#                                               # (mmdebstrap; no container registry needed)
#   scripts/build-image.sh --base IMAGE         # any Debian 12 image with python3 + venv
#   options: --tag localhost/vfio-dp:VERSION  --out dist/vfio-dp-VERSION.oci.tar  --keep
#
# Needs buildah (and podman + mmdebstrap for --debian-base): Debian packages of those names.
# Prints the archive's path and size on the last line. The built image is removed from local
# storage afterwards unless --keep (the archive is the product).
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
tag="localhost/vfio-dp:$version"
out="dist/vfio-dp-$version.oci.tar"
base=""
debian_base=0
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --debian-base) debian_base=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
need() { command -v "$1" >/dev/null || { echo "build-image.sh: $1 is not installed (Debian package $2)" >&2; exit 2; }; }
need buildah buildah

if [ "$debian_base" = 1 ]; then
  need podman podman
  need mmdebstrap mmdebstrap
  base=localhost/vfio-dp-base:bookworm-python3
  if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    cache=${VFIO_DP_CACHE:-$HOME/.cache/vfio_dp}/image
    mkdir -p "$cache"
    tar="$cache/bookworm-python3.tar"
    if [ ! -f "$tar" ]; then
      echo "build-image.sh: making a Debian 12 base with mmdebstrap (about a minute)" >&2
      # a private mount namespace: mmdebstrap's mounts (/proc, /sys, /dev/shm) die with it
      unshare --mount --propagation private mmdebstrap --variant=minbase --format=tar \
        --include=python3,python3-venv,passwd bookworm "$tar.tmp" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main" >&2
      mv "$tar.tmp" "$tar"
    fi
    podman import "$tar" "$base" >/dev/null
  fi
fi

# The host's CA bundle reaches the RUN steps only (pip behind a TLS-inspecting proxy trusts
# what the host trusts); nothing of it lands in the image.
build_dir=$(mktemp -d)
trap 'rm -rf "$build_dir"' EXIT
mounts=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$build_dir/ca.crt"
  printf '[global]\ncert = /opt/host-build/ca.crt\n' > "$build_dir/pip.conf"
  mounts=(-v "$build_dir:/opt/host-build:ro" -v "$build_dir/pip.conf:/etc/pip.conf:ro")
fi
args=(--build-arg "VERSION=$version")
[ -n "$base" ] && args+=(--build-arg "PYTHON_IMAGE=$base")
# chroot isolation: works where the OCI runtime may not set rlimits (containers, CI)
buildah bud --isolation chroot --network host "${mounts[@]}" "${args[@]}" \
  -f deploy/Containerfile -t "$tag" . >&2

mkdir -p "$(dirname "$out")"
rm -f "$out"
buildah push --quiet "$tag" "oci-archive:$out:$tag" >&2
[ "$keep" = 1 ] || buildah rmi "$tag" >/dev/null
bytes=$(stat -c %s "$out")
echo "$out $tag $(( (bytes + 524288) / 1048576 )) MiB"
