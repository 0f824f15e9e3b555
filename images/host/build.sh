#!/usr/bin/env bash
# Builds Unbounded's host OS boot image: Debian's kernel and an initramfs that is a small
# systemd root (booted from RAM, unified cgroup v2) with the agent and its unit.
#
# usage: build.sh OUT_DIR AGENT_BINARY
#   OUT_DIR gets vmlinuz, initrd.img (zstd cpio) and manifest.txt.
# env:   DEBIAN_MIRROR (default http://deb.debian.org/debian), DEBIAN_SUITE (bookworm),
#        UNBOUNDED_CACHE_DIR (default ~/.cache/unbounded; .debs are kept there),
#        HOST_MODULES_EXTRA (extra module paths under kernel/, space separated)
set -euo pipefail
out="${1:?usage: build.sh OUT_DIR AGENT_BINARY}"
agent="${2:?usage: build.sh OUT_DIR AGENT_BINARY}"
here="$(cd "$(dirname "$0")" && pwd)"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite="${DEBIAN_SUITE:-bookworm}"
cache="${UNBOUNDED_CACHE_DIR:-$HOME/.cache/unbounded}"
debs="$cache/debootstrap-debs/$suite"
mkdir -p "$debs" "$out"
work="$(mktemp -d "${TMPDIR:-/var/tmp}/unbounded-host.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/root"

step() { echo "host image: $*" >&2; }

# fdisk (sfdisk) and e2fsprogs (mkfs.ext4) lay out the disk of spec.template.storage;
# util-linux (wipefs, blkdiscard, partx, blkid, mount) is in minbase already. ipmitool reads
# the BMC's LAN channel through the host's IPMI device for the inventory's BMC suggestion.
# tpm2-tools (with libtss2) attests the machine with its TPM (agent/src/tpm.rs).
step "debootstrap $suite (minbase + systemd, networkd, nspawn, dbus, kmod, disk tools, ipmitool, tpm2-tools)"
debootstrap --variant=minbase --cache-dir="$debs" \
  --include=systemd,systemd-sysv,systemd-container,udev,dbus,iproute2,kmod,ca-certificates,fdisk,e2fsprogs,ipmitool,tpm2-tools \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

step "kernel: Debian's linux-image-amd64"
kpkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
[ -n "$kpkg" ] || { echo "cannot resolve linux-image-amd64 (apt-get update first)" >&2; exit 1; }
kdeb="$(ls "$debs"/"${kpkg}"_*.deb 2>/dev/null | head -1 || true)"
if [ -z "$kdeb" ]; then
  (cd "$debs" && apt-get download "$kpkg" >/dev/null)
  kdeb="$(ls "$debs"/"${kpkg}"_*.deb | head -1)"
fi
mkdir -p "$work/kernel"
dpkg-deb -x "$kdeb" "$work/kernel"
kver="$(ls "$work/kernel/lib/modules" | head -1)"
cp "$work/kernel/boot/vmlinuz-$kver" "$out/vmlinuz.tmp"

step "kernel modules for $kver (virtio, common server NICs, overlay, bridge, netfilter)"
src="$work/kernel/lib/modules/$kver"
dst="$root/lib/modules/$kver"
mkdir -p "$dst"
cp "$src"/modules.order "$src"/modules.builtin* "$dst"/ 2>/dev/null || true
# Directories under kernel/ copied whole: what a node needs (container networking and
# filesystems) and the NIC drivers of the servers people run (plus virtio for VMs).
dirs=(
  drivers/net/ethernet drivers/net/virtio_net.ko drivers/net/net_failover.ko net/core/failover.ko
  drivers/net/veth.ko drivers/net/tun.ko drivers/net/vxlan drivers/net/geneve.ko
  drivers/net/macvlan.ko drivers/net/ipvlan drivers/net/dummy.ko drivers/net/bonding drivers/net/mdio
  drivers/net/phy drivers/net/pcs drivers/ptp drivers/pps drivers/dca drivers/virtio drivers/block/virtio_blk.ko
  drivers/block/loop.ko drivers/char/hw_random/virtio-rng.ko lib
  fs/overlayfs fs/squashfs fs/fuse fs/nls
  fs/ext4 fs/jbd2 fs/mbcache.ko drivers/nvme drivers/ata drivers/scsi/sd_mod.ko drivers/scsi/scsi_mod.ko
  drivers/scsi/scsi_common.ko drivers/scsi/virtio_scsi.ko
  net/bridge net/llc net/802 net/netfilter net/ipv4/netfilter net/ipv6/netfilter net/ipv6
  net/ipv4/udp_tunnel.ko net/ipv6/ip6_udp_tunnel.ko net/sched net/vmw_vsock net/packet net/xfrm
  net/ipv4/ip_tunnel.ko net/ipv4/ipip.ko net/ipv4/tunnel4.ko net/key net/netlink crypto
  drivers/char/ipmi drivers/char/tpm
)
for d in "${dirs[@]}" ${HOST_MODULES_EXTRA:-}; do
  [ -e "$src/kernel/$d" ] || continue
  mkdir -p "$dst/kernel/$(dirname "$d")"
  cp -a "$src/kernel/$d" "$dst/kernel/$(dirname "$d")/"
done
# Drivers for hardware a node never has (wireless, InfiniBand-only stacks stay out).
chroot "$root" depmod "$kver"

step "agent, units and settings"
install -m 0755 "$agent" "$root/usr/local/bin/unbounded-agent"
cp -a "$here/overlay/." "$root/"
chroot "$root" systemctl enable systemd-networkd.service unbounded-agent.service unbounded-root-size.service >/dev/null 2>&1
# The wait for "network online" is what the agent does itself, with backoff.
# Nothing the appliance needs; each costs seconds of a boot under emulation. The serial
# getty stays: a person at the BMC's console can still log in (root is locked until an
# operator adds a key or a password to the image).
chroot "$root" systemctl mask systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
  dpkg-db-backup.timer getty@tty1.service systemd-update-utmp.service \
  systemd-update-utmp-runlevel.service ipmievd.service >/dev/null 2>&1 || true
ln -sf /lib/systemd/systemd "$root/init"
# A fresh, unique machine ID at every boot (the root lives in RAM).
: >"$root/etc/machine-id"
echo unbounded >"$root/etc/hostname"
passwd -R "$root" -l root >/dev/null

step "trimming (docs, locales, apt lists, caches)"
# ipmitool's IANA enterprise-number list (4 MB) only names vendors in its output.
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,bug} "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/misc/enterprise-numbers* \
  "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old "$root"/var/log/*.log

step "initramfs (cpio, zstd -3)"
(cd "$root" && find . -xdev -print0 | LC_ALL=C sort -z \
  | cpio --null -o -H newc --quiet --reproducible) | zstd -3 -T0 -q >"$out/initrd.img.tmp"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$out/initrd.img.tmp" "$out/initrd.img"
{
  echo "kernel $kpkg $kver"
  echo "suite $suite"
  echo "root $(du -sm "$root" | cut -f1) MB"
  echo "initrd $(du -m "$out/initrd.img" | cut -f1) MB"
} >"$out/manifest.txt"
step "done: $(tr '\n' ';' <"$out/manifest.txt")"
