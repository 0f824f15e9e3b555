#!/usr/bin/env bash
# Builds the node's container runtime from Go modules at pinned releases: containerd (with
# its runc shim and ctr) and the CNI plugins the node's network configuration uses.
# Debian bookworm's containerd 1.6 is older than kubelet 1.35 supports. Idempotent.
#
# usage: build-tools.sh OUT_DIR     (OUT_DIR/bin gets the binaries)
set -euo pipefail
out="${1:?usage: build-tools.sh OUT_DIR}"
containerd_version="${CONTAINERD_VERSION:-v2.2.1}"
cni_version="${CNI_PLUGINS_VERSION:-v1.9.1}"
command -v go >/dev/null || { echo "error: the Go toolchain is required (go not on PATH)" >&2; exit 1; }
mkdir -p "$out/bin"
cd "$out"
export CGO_ENABLED=0 GOFLAGS="-trimpath -modcacherw" GOBIN="$out/bin.tmp"
# This build's own Go caches, removed once the binaries are in place (as
# testbed/scripts/build-kubernetes.sh does: a later build has other sources; a failed one
# keeps them to resume).
export GOCACHE="$out/cache/go-build" GOMODCACHE="$out/cache/mod"

want=(containerd containerd-shim-runc-v2 ctr bridge host-local loopback portmap)
missing=0
for b in "${want[@]}"; do [ -x "bin/$b" ] || missing=1; done
[ "$missing" = 0 ] && { echo "node tools: cached in $out/bin" >&2; exit 0; }

mkdir -p "$GOBIN"
echo "node tools: containerd $containerd_version (containerd, shim, ctr)" >&2
cd_pkg=github.com/containerd/containerd/v2
go install -tags "no_btrfs no_devmapper no_zfs" \
  -ldflags "-s -w -X $cd_pkg/version.Version=$containerd_version -X $cd_pkg/version.Revision=unbounded" \
  "$cd_pkg/cmd/containerd@$containerd_version" \
  "$cd_pkg/cmd/containerd-shim-runc-v2@$containerd_version" \
  "$cd_pkg/cmd/ctr@$containerd_version"
echo "node tools: CNI plugins $cni_version (bridge, host-local, loopback, portmap)" >&2
cni=github.com/containernetworking/plugins/plugins
go install -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni_version" \
  "$cni/main/bridge@$cni_version" "$cni/ipam/host-local@$cni_version" \
  "$cni/main/loopback@$cni_version" "$cni/meta/portmap@$cni_version"
mv "$GOBIN"/* bin/
rmdir "$GOBIN"
rm -rf "$out/cache"
echo "containerd $containerd_version, cni-plugins $cni_version" >"$out/versions.txt"
echo "node tools: built into $out/bin" >&2
