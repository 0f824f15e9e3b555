#!/usr/bin/env bash
# Builds the "marker" boot image used by the PXE tests: Debian's kernel and a tiny busybox
# initramfs whose init prints "UNBOUNDED-MARKER" with the kernel command line on the serial
# console, then powers the VM off, or with `unbounded.marker=hold` on the command line stays
# up (power tests: the BMC must find it on, and power it off itself). Idempotent: does nothing when the output exists.
#
# usage: build-marker-image.sh <output-dir>   (writes vmlinuz and initrd.img)
set -euo pipefail
out="${1:?usage: build-marker-image.sh <output-dir>}"
mkdir -p "$out"
# Tests build it concurrently: one at a time.
exec 9>"$out/.lock"
flock 9
if [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ]; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The kernel: the package linux-image-amd64 depends on, unpacked (not installed).
pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
if [ -z "$pkg" ]; then
  apt-get update -q >/dev/null
  pkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
fi
echo "marker image: kernel from $pkg"
(cd "$work" && apt-get download -q "$pkg" >/dev/null)
dpkg-deb --fsys-tarfile "$work"/"$pkg"_*.deb | tar -x -C "$work" --wildcards './boot/vmlinuz-*'
cp "$work"/boot/vmlinuz-* "$out/vmlinuz.tmp"

# The initramfs: static busybox and an init that prints the marker.
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys}
cp /bin/busybox "$root/bin/busybox"
cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t proc proc /proc
exec >/dev/ttyS0 2>&1
cmdline="$(/bin/busybox cat /proc/cmdline)"
echo "UNBOUNDED-MARKER $cmdline"
case " $cmdline " in
  *" unbounded.marker=hold "*) while :; do /bin/busybox sleep 3600; done ;;
esac
/bin/busybox poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/initrd.img.tmp"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$out/initrd.img.tmp" "$out/initrd.img"
echo "marker image: $(du -h "$out/vmlinuz" | cut -f1) kernel, $(du -h "$out/initrd.img" | cut -f1) initrd in $out"
