#!/usr/bin/env bash
# Installs the BMC emulators the power tests drive, into a virtualenv in the cache:
# sushy-tools (Redfish, libvirt driver) and virtualbmc (IPMI over LAN, libvirt). Both
# need libvirt-python, which builds against Debian's libvirt-dev. Safe to run again.
#
#   bash testbed/scripts/install-bmc-emulators.sh     # prints the venv's bin directory
set -euo pipefail
cache="${UNBOUNDED_CACHE_DIR:-$HOME/.cache/unbounded}"
venv="$cache/bmc-venv"
# Pinned: the versions TESTBED-NOTES.md checked against libvirt 9.0.
sushy_tools=2.2.0
virtualbmc=3.3.0
stamp="$venv/.installed-sushy-$sushy_tools-vbmc-$virtualbmc"

mkdir -p "$cache"
exec 9>"$cache/bmc-venv.lock"
flock 9
if [ ! -e "$stamp" ]; then
  rm -rf "$venv"
  # The system python: libvirt-python links against the system's libvirt.
  /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "sushy-tools==$sushy_tools" "virtualbmc==$virtualbmc" >&2
  touch "$stamp"
fi
echo "$venv/bin"
