#!/usr/bin/env bash
# Builds what Unbounded's container images carry besides its own binaries, from pinned
# Debian packages (contents.lock beside this script):
#   - the iPXE builds the bootserver serves: BIOS undionly.kpxe and x86-64 UEFI ipxe.efi and
#     snponly.efi from bookworm's ipxe, arm64 UEFI arm64/ipxe.efi from trixie's;
#   - the CA bundle: every certificate of Debian's ca-certificates, in name order (what
#     update-ca-certificates writes on a Debian host without local additions).
# Every download is checked against contents.lock, and so is every output; a difference
# stops the build. Nothing is compiled: the same lock gives the same bytes.
#
# usage: build-contents.sh OUT_DIR
#   OUT_DIR gets ipxe/{undionly.kpxe,ipxe.efi,snponly.efi,arm64/ipxe.efi},
#   ca-certificates.crt and contents.txt (the lines of contents.lock that were used).
# env:   UNBOUNDED_CACHE_DIR      default ~/.cache/unbounded; the .debs are kept in its debs/,
#                                 apt's state for each suite in apt/<archive>-<suite>/
#        UNBOUNDED_DEBIAN_MIRROR  default http://deb.debian.org (the archive names are
#                                 appended: debian, debian-security); a snapshot such as
#                                 http://snapshot.debian.org/archive (with a date after the
#                                 archive name in the lock's origin) keeps old versions
#        UNBOUNDED_DEBIAN_KEYRING default /usr/share/keyrings/debian-archive-keyring.gpg
# The .debs come through apt (`apt-get download`) with a private configuration per suite, so
# the host's own sources do not matter; apt checks each index against Debian's signature and
# each .deb against the index, and this script checks the .deb against the lock.
set -euo pipefail
out="${1:?usage: build-contents.sh OUT_DIR}"
here="$(cd "$(dirname "$0")" && pwd)"
lock="$here/contents.lock"
cache="${UNBOUNDED_CACHE_DIR:-$HOME/.cache/unbounded}"
debs="$cache/debs"
mirror="${UNBOUNDED_DEBIAN_MIRROR:-http://deb.debian.org}"
keyring="${UNBOUNDED_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}"
mkdir -p "$out" "$debs"
work="$(mktemp -d "${TMPDIR:-/var/tmp}/unbounded-contents.XXXXXX")"
trap 'rm -rf "$work"' EXIT

step() { echo "contents: $*" >&2; }
fail() { echo "contents: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# deb_field NAME SUITE COLUMN: one column of the lock's `deb` line of NAME from SUITE
# (3 version, 4 sha256, 5 archive/suite).
deb_field() {
  awk -v n="$1" -v s="$2" -v c="$3" '
    $1 == "deb" && $2 == n { split($5, o, "/"); if (o[2] == s) { print $c; found = 1 } }
    END { exit !found }' "$lock" || fail "contents.lock has no deb line for $1 from $2"
}

# check FILE PINNED WHAT: refuses a file whose SHA-256 is not the pinned one.
check() {
  local actual
  actual="$(sha "$1")"
  [ "$2" = "$actual" ] && return 0
  fail "$3: sha256 $actual, contents.lock pins $2: refusing (if the change is intended, pin the new sha256 in $lock)"
}

: >"$out/contents.txt.tmp"
record() { echo "$*" >>"$out/contents.txt.tmp"; }

# apt_download ARCHIVE SUITE NAME VERSION: fetches the .deb into $debs with apt, configured
# for that one suite (its index is fetched once and kept in the cache).
apt_download() {
  local archive="$1" suite="$2" name="$3" version="$4" dir="$cache/apt/$1-$2"
  mkdir -p "$dir/lists/partial" "$dir/archives/partial"
  echo "deb [signed-by=$keyring] $mirror/$archive $suite main" >"$dir/sources.list"
  [ -f "$dir/status" ] || : >"$dir/status"
  local opts=(
    -o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$dir/lists" -o "Dir::State::status=$dir/status"
    -o "Dir::Cache=$dir" -o "Dir::Cache::archives=$dir/archives" -o Acquire::Languages=none
  )
  if ! apt-cache "${opts[@]}" show "$name=$version" >/dev/null 2>&1; then
    step "apt: the index of $archive $suite"
    apt-get "${opts[@]}" -q update >"$work/apt.log" 2>&1 || {
      cat "$work/apt.log" >&2
      fail "apt-get update of $mirror/$archive $suite failed"
    }
  fi
  (cd "$debs" && apt-get "${opts[@]}" -q download "$name=$version" >"$work/apt.log" 2>&1) || {
    cat "$work/apt.log" >&2
    fail "cannot download $name $version from $archive $suite: if the mirror no longer has that version, pin the current one (version and sha256) in $lock, or set UNBOUNDED_DEBIAN_MIRROR to a snapshot that has it"
  }
}

# deb NAME SUITE: the verified .deb of the pinned version (downloaded once into the cache),
# unpacked into $work/NAME@SUITE.
deb() {
  local name="$1" suite="$2" version pinned origin file
  version="$(deb_field "$name" "$suite" 3)"
  pinned="$(deb_field "$name" "$suite" 4)"
  origin="$(deb_field "$name" "$suite" 5)"
  file="$debs/${name}_${version//:/%3a}_all.deb"
  if [ ! -f "$file" ]; then
    apt_download "${origin%%/*}" "$suite" "$name" "$version"
  fi
  check "$file" "$pinned" "$name $version (.deb)"
  record deb "$name" "$version" "$pinned" "$origin"
  dpkg-deb -x "$file" "$work/$name@$suite"
}

step "Debian packages"
while read -r kind name _ _ origin; do
  [ "$kind" = deb ] || continue
  step "  $name $(deb_field "$name" "${origin#*/}" 3) ($origin)"
  deb "$name" "${origin#*/}"
done <"$lock"

step "files"
while read -r kind name _ pinned origin; do
  [ "$kind" = file ] || continue
  target="$out/$name"
  mkdir -p "$(dirname "$target")"
  # origin: deb:<package>@<suite>:<path> or bundle:<package>@<suite>:<directory>
  how="${origin%%:*}"
  rest="${origin#*:}"
  source="$work/${rest%%:*}${rest#*:}"
  [ -e "$source" ] || fail "$name: $origin is not in the unpacked packages (is its deb line in the lock?)"
  case "$how" in
    deb) cp "$source" "$target" ;;
    bundle)
      : >"$target"
      while IFS= read -r -d '' pem; do
        cat "$pem" >>"$target"
        [ -z "$(tail -c1 "$pem")" ] || echo >>"$target"
      done < <(find "$source" -name '*.crt' -print0 | LC_ALL=C sort -z)
      ;;
    *) fail "contents.lock: unknown origin $origin" ;;
  esac
  check "$target" "$pinned" "$name"
  chmod 0644 "$target"
  record file "$name" - "$pinned" "$origin"
done <"$lock"
mv "$out/contents.txt.tmp" "$out/contents.txt"
step "done: $(grep -c '^file' "$out/contents.txt") files"
