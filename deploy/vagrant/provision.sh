#!/bin/bash
# Provisioning for the Vagrant demo VM (see the Vagrantfile and README.md ("Try it in a VM")).
# Runs as root inside the VM, one stage per call: iommu | kubernetes | toolkit | kubevirt.
#
# Network: this script downloads k3s (its install script and binary), container base images,
# and optionally KubeVirt's release manifests from their upstream sites, and Python packages
# from PyPI. A Vagrant user is online; the project's CI never runs it (CI only runs
# `vagrant validate` and checks this file's structure).
set -euo pipefail

SRC=/vagrant
IMAGE=localhost/vfio-dp:0.1.0
K3S_VERSION=${K3S_VERSION:-v1.31.4+k3s1}
KUBEVIRT_VERSION=${KUBEVIRT_VERSION:-v1.4.0}
WITH_KUBEVIRT=${WITH_KUBEVIRT:-0}
KUBECTL="k3s kubectl"
export DEBIAN_FRONTEND=noninteractive

log() { printf '\n=== %s\n' "$*"; }

stage_iommu() {
  log "kernel command line: intel_iommu=on iommu=pt"
  local grub=/etc/default/grub
  if ! grep -q 'intel_iommu=on' "$grub"; then
    sed -i 's/^GRUB_CMDLINE_LINUX="\(.*\)"/GRUB_CMDLINE_LINUX="\1 intel_iommu=on iommu=pt"/' "$grub"
    update-grub
  fi
  # vfio-pci at boot, so `vfioctl bind` and the daemon find the driver.
  printf 'vfio\nvfio_iommu_type1\nvfio-pci\n' > /etc/modules-load.d/vfio.conf
  # Vagrant reboots the VM after this stage (reboot: true in the Vagrantfile).
}

stage_kubernetes() {
  log "checking the IOMMU"
  if ! grep -q 'intel_iommu=on' /proc/cmdline || [ -z "$(ls -A /sys/kernel/iommu_groups 2>/dev/null)" ]; then
    echo "no IOMMU groups: did the VM boot with intel_iommu=on and the intel-iommu device?" >&2
    exit 1
  fi
  log "installing k3s $K3S_VERSION (single node)"
  apt-get update
  apt-get install -y --no-install-recommends curl ca-certificates
  if ! command -v k3s >/dev/null; then
    curl -sfL https://get.k3s.io | INSTALL_K3S_VERSION="$K3S_VERSION" \
      INSTALL_K3S_EXEC="server --disable traefik --write-kubeconfig-mode 0644" sh -
  fi
  until $KUBECTL get node "$(hostname)" >/dev/null 2>&1; do sleep 2; done
  $KUBECTL wait --for=condition=Ready "node/$(hostname)" --timeout=300s
  # Opt this node in to the vfio-dp DaemonSet.
  $KUBECTL label node "$(hostname)" vfio.kubevirt.io/enabled=true --overwrite
  echo 'export KUBECONFIG=/etc/rancher/k3s/k3s.yaml' > /etc/profile.d/k3s.sh
}

stage_toolkit() {
  log "installing vfioctl from the checkout (pip install .)"
  apt-get install -y --no-install-recommends python3-venv python3-dev build-essential \
    pkg-config libvirt-dev libvirt0 pciutils podman openssl
  python3 -m venv /opt/vfio-dp
  /opt/vfio-dp/bin/pip install --upgrade pip
  /opt/vfio-dp/bin/pip install "$SRC"
  ln -sf /opt/vfio-dp/bin/vfioctl /usr/local/bin/vfioctl
  vfioctl groups || true

  log "building the image $IMAGE and loading it into k3s's containerd"
  podman build -f "$SRC/deploy/Containerfile" -t "$IMAGE" "$SRC"
  podman save "$IMAGE" | k3s ctr images import -

  log "applying deploy/overlays/vagrant"
  $KUBECTL apply -k "$SRC/deploy/overlays/vagrant"
  # the in-cluster CA: the Job makes the webhook's Secret and sets the caBundle
  $KUBECTL -n vfio-dp wait --for=condition=complete job -l app.kubernetes.io/name=vfio-dp-webhook-certs --timeout=300s
  $KUBECTL -n vfio-dp rollout status daemonset/vfio-dp-daemon --timeout=300s
  $KUBECTL -n vfio-dp rollout status deployment/vfio-dp-webhook --timeout=300s
  # Wait until the kubelet sees the e1000e capacity the daemon advertises.
  for _ in $(seq 60); do
    cap=$($KUBECTL get node "$(hostname)" \
      -o jsonpath='{.status.allocatable.devices\.kubevirt\.io/8086_10d3}' || true)
    [ -n "$cap" ] && [ "$cap" != "0" ] && break
    sleep 2
  done
  $KUBECTL get node "$(hostname)" -o jsonpath='{.status.allocatable}'; echo
}

stage_kubevirt() {
  if [ "$WITH_KUBEVIRT" != "1" ]; then
    echo "KubeVirt not requested (VFIO_DP_KUBEVIRT=1 vagrant provision to add it)"
    return 0
  fi
  log "installing KubeVirt $KUBEVIRT_VERSION"
  local base="https://github.com/kubevirt/kubevirt/releases/download/$KUBEVIRT_VERSION"
  $KUBECTL apply -f "$base/kubevirt-operator.yaml"
  $KUBECTL wait --for condition=established crd/kubevirts.kubevirt.io --timeout=120s
  local emulation=false
  [ -e /dev/kvm ] || emulation=true # no nested KVM: software emulation (slow but works)
  $KUBECTL apply -f - <<YAML
apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata:
  name: kubevirt
  namespace: kubevirt
spec:
  configuration:
    developerConfiguration:
      useEmulation: $emulation
      featureGates: [HostDevices, GPU]
    permittedHostDevices:
      pciHostDevices:
        - pciVendorSelector: "8086:10D3"
          resourceName: devices.kubevirt.io/8086_10d3
          externalResourceProvider: true
YAML
  $KUBECTL -n kubevirt wait kv/kubevirt --for=condition=Available --timeout=900s
}

case "${1:-}" in
  iommu) stage_iommu ;;
  kubernetes) stage_kubernetes ;;
  toolkit) stage_toolkit ;;
  kubevirt) stage_kubevirt ;;
  *) echo "usage: $0 iommu|kubernetes|toolkit|kubevirt" >&2; exit 2 ;;
esac
