#!/usr/bin/env bash
# Installs sushy-tools (the Redfish BMC emulator, libvirt driver) into a virtualenv in the
# cache; it needs libvirt-python, which builds against Debian's libvirt-dev. (The IPMI
# emulator is Debian's openipmi: ipmi_sim.) Safe to run again.
#
#   bash testbed/scripts/install-bmc-emulators.sh     # prints the venv's bin directory
set -euo pipefail
cache="${UNBOUNDED_CACHE_DIR:-$HOME/.cache/unbounded}"
venv="$cache/bmc-venv"
# Pinned: the version TESTBED-NOTES.md checked against libvirt 9.0.
sushy_tools=2.2.0
# sushy-tools loads its libvirt driver only when libvirt-python is importable.
libvirt_python=12.8.0
stamp="$venv/.installed-sushy-$sushy_tools-libvirt-$libvirt_python"

mkdir -p "$cache"
exec 9>"$cache/bmc-venv.lock"
flock 9
if [ ! -e "$stamp" ]; then
  rm -rf "$venv"
  # The system python: libvirt-python links against the system's libvirt.
  /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check \
    "sushy-tools==$sushy_tools" "libvirt-python==$libvirt_python" >&2
  touch "$stamp"
fi
echo "$venv/bin"
