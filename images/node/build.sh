#!/usr/bin/env bash
# Builds Unbounded's node image: the root filesystem of the systemd-nspawn container in which
# kubelet runs, as node.tar.zst plus its sha256.
#
# usage: build.sh OUT_DIR KUBELET_BINARY TOOLS_BIN_DIR PAUSE_ARCHIVE
#   TOOLS_BIN_DIR holds containerd, containerd-shim-runc-v2, ctr and the CNI plugins
#   (build-tools.sh); PAUSE_ARCHIVE is an OCI archive of the pause image.
# env: DEBIAN_MIRROR, DEBIAN_SUITE, UNBOUNDED_CACHE_DIR as for the host image.
set -euo pipefail
out="${1:?usage: build.sh OUT_DIR KUBELET TOOLS_BIN_DIR PAUSE_ARCHIVE}"
kubelet="${2:?}"; tools="${3:?}"; pause="${4:?}"
here="$(cd "$(dirname "$0")" && pwd)"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite="${DEBIAN_SUITE:-bookworm}"
cache="${UNBOUNDED_CACHE_DIR:-$HOME/.cache/unbounded}"
debs="$cache/debootstrap-debs/$suite"
mkdir -p "$debs" "$out"
work="$(mktemp -d "${TMPDIR:-/var/tmp}/unbounded-node.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root="$work/root"
step() { echo "node image: $*" >&2; }

step "debootstrap $suite (minbase + systemd, dbus, iptables, runc, conntrack)"
debootstrap --variant=minbase --cache-dir="$debs" \
  --include=systemd,systemd-sysv,dbus,iproute2,iptables,kmod,ca-certificates,runc,conntrack \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

step "kubelet, containerd, CNI plugins, pause image"
install -m 0755 "$kubelet" "$root/usr/local/bin/kubelet"
# Symbols are not needed on a node (a third of the binary).
strip --strip-all "$root/usr/local/bin/kubelet"
for b in containerd containerd-shim-runc-v2 ctr; do install -m 0755 "$tools/$b" "$root/usr/local/bin/$b"; done
mkdir -p "$root/opt/cni/bin"
for b in bridge host-local loopback portmap; do install -m 0755 "$tools/$b" "$root/opt/cni/bin/$b"; done
cp -a "$here/overlay/." "$root/"
install -D -m 0644 "$pause" "$root/usr/share/unbounded/pause.tar"
# Which kubelet this image carries: the agent refuses it for a MachineConfiguration whose
# kubernetes.version is another (agent/src/kubelet_version.rs reads this file).
kubelet_version="$("$kubelet" --version 2>/dev/null | awk '{print $2}')"
case "$kubelet_version" in v[0-9]*.[0-9]*.[0-9]*) ;; *) echo "kubelet --version printed no version" >&2; exit 1 ;; esac
echo "$kubelet_version" >"$root/usr/share/unbounded/kubelet-version"
mkdir -p "$root/var/lib/kubelet" "$root/etc/unbounded"
chroot "$root" systemctl enable containerd.service unbounded-pause-image.service kubelet.service >/dev/null 2>&1
# Inside the container: nothing to do for the network (host network), no consoles to get.
chroot "$root" systemctl mask systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer console-getty.service \
  getty@tty1.service systemd-resolved.service e2scrub_all.timer e2scrub_reap.service \
  dpkg-db-backup.timer systemd-update-utmp.service systemd-update-utmp-runlevel.service \
  systemd-logind.service >/dev/null 2>&1 || true
: >"$root/etc/machine-id"
passwd -R "$root" -l root >/dev/null

step "trimming (docs, locales, apt lists, caches)"
rm -rf "$root"/usr/share/{doc,man,info,locale,lintian,bug} "$root"/var/lib/apt/lists/* \
  "$root"/var/cache/apt/* "$root"/var/log/*.log

step "archive (tar, zstd -3) and sha256"
# /dev, /proc, /sys and /run are the container manager's to fill.
tar --numeric-owner --xattrs -C "$root" --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* \
  --exclude=./run/* -cf - . | zstd -3 -T0 -q >"$out/node.tar.zst.tmp"
mv "$out/node.tar.zst.tmp" "$out/node.tar.zst"
sha256sum "$out/node.tar.zst" | cut -d' ' -f1 >"$out/node.tar.zst.sha256"
{
  echo "kubelet $kubelet_version"
  echo "root $(du -sm "$root" | cut -f1) MB"
  echo "archive $(du -m "$out/node.tar.zst" | cut -f1) MB"
  echo "sha256 $(cat "$out/node.tar.zst.sha256")"
} >"$out/manifest.txt"
step "done: $(tr '\n' ';' <"$out/manifest.txt")"
