#!/usr/bin/env bash
# Installs the peers and neutral clients that `unbounded-testbed bench` compares our
# bootserver with, when they are missing: Kea 2.2 (kea-dhcp4-server, kea-dhcp6-server)
# and perfdhcp (kea-admin), dnsmasq, tftpd-hpa, nginx, and the clients atftp and wrk. Also
# perf and valgrind, which docs/benchmarks.md's profiling steps use. Safe to run again.
#
# The benchmark runs every server itself, inside network namespaces it creates, with its
# own configuration. The packages' own services must not start on the host (nginx would
# take port 80, tftpd-hpa port 69, kea-dhcp4 and kea-dhcp6 the DHCP ports): the
# installation runs with a policy-rc.d that forbids starting services, removed again
# afterwards.
set -euo pipefail

packages=(kea-dhcp4-server kea-dhcp6-server kea-admin dnsmasq-base tftpd-hpa nginx-light wrk atftp linux-perf valgrind)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-bench-deps: all ${#packages[@]} packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-bench-deps: missing packages: ${missing[*]}; run as root (or install them) first" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
ours=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# unbounded install-bench-deps: no service starts during installation\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  ours=1
fi
cleanup() { if [ -n "$ours" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

echo "install-bench-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q -o DPkg::Lock::Timeout=600
apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"
echo "install-bench-deps: done"
