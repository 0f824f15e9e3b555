#!/usr/bin/env bash
# Builds Cluster API's core controller manager and clusterctl from Cluster API's own Go
# module at one pinned release, through the Go module proxy, into OUT_DIR (as
# build-kubernetes.sh builds Kubernetes), and keeps the module's manifests (`config/`: the
# core CRDs, RBAC, webhooks; `metadata.yaml`) beside them, which the testbed applies (there is
# no release download here). Idempotent: exits at once when all of it is there.
#
# usage: build-cluster-api.sh VERSION OUT_DIR   (VERSION like v1.13.6)
set -euo pipefail

version="${1:?usage: build-cluster-api.sh VERSION OUT_DIR}"
out="${2:?usage: build-cluster-api.sh VERSION OUT_DIR}"
binaries=(cluster-api-manager clusterctl)

all_present=1
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || all_present=0; done
[ -d "$out/config/crd" ] || all_present=0
if [ "$all_present" = 1 ]; then
  echo "cluster-api $version: cached in $out"
  exit 0
fi

command -v go >/dev/null || { echo "error: the Go toolchain is required (go not on PATH)" >&2; exit 1; }

work="$out.build"
mkdir -p "$work" "$out"
cd "$work"

# This build's own Go caches, removed once the binaries are in place (see
# build-kubernetes.sh: they serve no later build and fill small disks).
export GOCACHE="$work/cache/go-build" GOMODCACHE="$work/cache/mod" GOFLAGS=-modcacherw

# A module of our own that requires Cluster API: its main packages are built from the
# dependency (its own go.mod's replace directives, which `go install pkg@version` refuses,
# do not apply to a dependency).
cat > go.mod <<MOD
module unbounded.local/cluster-api-build

go 1.25.0

require sigs.k8s.io/cluster-api $version
MOD
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "sigs.k8s.io/cluster-api"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
)
GO

progress() {
  local what="$1" unit="$2" start=$SECONDS count=0 last=$SECONDS line
  while IFS= read -r line; do
    count=$((count + 1))
    echo "$line" >>"$what.log"
    if (( SECONDS - last >= 15 )); then
      last=$SECONDS
      echo "cluster-api $version: $what: $count $unit so far, $((SECONDS - start)) s"
    fi
  done
}

echo "cluster-api $version: resolving modules (go mod tidy)"
: >tidy.log
if ! GOFLAGS="-mod=mod -modcacherw" go mod tidy -e -x 2>&1 | progress tidy "steps"; then
  tail -20 tidy.log >&2; exit 1
fi

# clusterctl and the manager print their version from these (`clusterctl version`).
major_minor="${version#v}"
ldflags="-s -w"
pkg=sigs.k8s.io/cluster-api/version
ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=${major_minor%%.*}"
minor="${major_minor#*.}"
ldflags="$ldflags -X $pkg.gitMinor=${minor%%.*} -X $pkg.gitTreeState=clean"
ldflags="$ldflags -X $pkg.buildDate=1970-01-01T00:00:00Z"

build() {
  local name="$1" package="$2"
  [ -x "$out/$name" ] && return 0
  echo "cluster-api $version: building $name"
  : >"build-$name.log"
  if ! CGO_ENABLED=0 go build -v -tags tools -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" \
      "$package" 2>&1 | progress "build-$name" "packages compiled"; then
    tail -20 "build-$name.log" >&2; exit 1
  fi
  [ -x "$out/$name.tmp" ] || { tail -20 "build-$name.log" >&2; exit 1; }
  mv "$out/$name.tmp" "$out/$name"
}
build cluster-api-manager sigs.k8s.io/cluster-api
build clusterctl sigs.k8s.io/cluster-api/cmd/clusterctl
module_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)"
rm -rf "$out/config.tmp"
cp -r "$module_dir/config" "$out/config.tmp"
cp "$module_dir/metadata.yaml" "$out/config.tmp/metadata.yaml"
chmod -R u+w "$out/config.tmp"
rm -rf "$out/config"
mv "$out/config.tmp" "$out/config"
rm -rf "$work/cache"
echo "cluster-api $version: built into $out"
