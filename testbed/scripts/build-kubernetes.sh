#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet (or
# only the BINARY arguments: a node image for another release needs only its kubelet) from
# Kubernetes' own Go modules at one pinned release, through the Go module proxy, into
# OUT_DIR. Idempotent: exits at once when every binary is there.
#
# usage: build-kubernetes.sh VERSION OUT_DIR [BINARY...]   (VERSION like v1.35.4)
set -euo pipefail

version="${1:?usage: build-kubernetes.sh VERSION OUT_DIR [BINARY...]}"
out="${2:?usage: build-kubernetes.sh VERSION OUT_DIR [BINARY...]}"
shift 2
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
[ "$#" -gt 0 ] && binaries=("$@")

all_present=1
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || all_present=0; done
if [ "$all_present" = 1 ]; then
  echo "kubernetes $version: cached in $out"
  exit 0
fi

command -v go >/dev/null || { echo "error: the Go toolchain is required (go not on PATH)" >&2; exit 1; }

major_minor="${version#v}"            # 1.35.4
major="${major_minor%%.*}"             # 1
minor="${major_minor#*.}"; minor="${minor%%.*}"   # 35
staging_version="v0.${minor}.${major_minor##*.}"  # v0.35.4

# The modules that kubernetes' go.mod points at ./staging/... (v1.35).
staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
  cloud-provider cluster-bootstrap code-generator component-base component-helpers
  controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
  endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
  kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
  sample-apiserver sample-cli-plugin sample-controller)

work="$out.build"
mkdir -p "$work" "$out"
cd "$work"

# This build's own Go caches, removed once the binaries are in place: the packages compiled
# (3.5 GB for the five) and the modules downloaded (1.2 GB) serve no later build (another
# release is other sources), and they are what filled a CI machine's disk. A failed build
# keeps them, so that the next try resumes where it stopped.
export GOCACHE="$work/cache/go-build" GOMODCACHE="$work/cache/mod" GOFLAGS=-modcacherw

{
  echo "module unbounded.local/kubernetes-build"
  echo
  echo "go 1.25.0"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  for m in "${staging[@]}"; do echo "replace k8s.io/$m => k8s.io/$m $staging_version"; done
} > go.mod

cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO

# Progress on long steps: every 15 s, what is being done, how many Go packages (or modules)
# it has got through and how long it has taken so far (a cold build is ~10 minutes).
progress() {
  local what="$1" unit="$2" start=$SECONDS count=0 last=$SECONDS line
  while IFS= read -r line; do
    count=$((count + 1))
    echo "$line" >>"$what.log"
    if (( SECONDS - last >= 15 )); then
      last=$SECONDS
      echo "kubernetes $version: $what: $count $unit so far, $((SECONDS - start)) s"
    fi
  done
}

echo "kubernetes $version: resolving modules (go mod tidy; a few minutes on a cold cache)"
: >tidy.log
if ! GOFLAGS="-mod=mod -modcacherw" go mod tidy -e -x 2>&1 | progress tidy "steps"; then
  tail -20 tidy.log >&2; exit 1
fi

# -s -w: no symbol table or DWARF. Nothing here debugs these binaries; leaving the debug
# information out shortens each of the five links (kubelet's, packages cached: 18.8 s →
# 7.2 s) and makes kubelet, which the node image carries, 36 MB smaller (119 → 83 MB).
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

for b in "${binaries[@]}"; do
  if [ -x "$out/$b" ]; then continue; fi
  echo "kubernetes $version: building $b (the first takes longest: most packages are shared)"
  : >"build-$b.log"
  if ! CGO_ENABLED=0 go build -v -tags tools -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" \
      "k8s.io/kubernetes/cmd/$b" 2>&1 | progress "build-$b" "packages compiled"; then
    tail -20 "build-$b.log" >&2; exit 1
  fi
  [ -x "$out/$b.tmp" ] || { tail -20 "build-$b.log" >&2; exit 1; }
  mv "$out/$b.tmp" "$out/$b"
done
rm -rf "$work/cache"
echo "kubernetes $version: built into $out"
