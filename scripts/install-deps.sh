#!/usr/bin/env bash
# Installs the Debian packages Unbounded's testbed and tests use, when they
# are missing. Safe to run again: it installs only what is absent.
set -euo pipefail

packages=(
  # control plane for tests
  etcd-server openssl
  # network tests: namespaces, real DHCP and TFTP clients, reference servers
  iproute2 isc-dhcp-client isc-dhcp-relay dhcpcd-base busybox-static atftp dnsmasq-base tcpdump curl socat
  # PXE under QEMU
  qemu-system-x86 qemu-utils ipxe ipxe-qemu ovmf cpio zstd
  # images: host OS and node root file systems, static pause (and the static binaries of the
  # container images), OCI checks
  debootstrap skopeo libc6-dev
  # the lab's container registry (the appliance pulls the project's images from it)
  docker-registry
  # BMC emulators driving QEMU through libvirt (sushy-tools in a venv; OpenIPMI's ipmi_sim)
  libvirt-daemon-system libvirt-dev pkg-config python3-venv python3-dev gcc ipmitool openipmi
  # the kubectl plugin's terminal test (status --watch in a real terminal)
  tmux
  # the agent's storage tests on loop devices (sfdisk; wipefs, blkdiscard, partx and mkfs.ext4
  # come with util-linux and e2fsprogs)
  fdisk util-linux e2fsprogs
  # a real LLDP sender: the agent's LLDP capture test, the discovery scenario's switch
  lldpd
  # the test command's runner reads cargo's list of test binaries (scripts/run-test-binaries)
  jq
  # TPM identity: software TPMs (the lab VMs' through libvirt, the tests' on sockets) and tpm2-tools
  swtpm swtpm-tools tpm2-tools libtss2-tcti-swtpm0
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or install them) first" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# An old package list finds nothing: refresh it once.
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
