#!/usr/bin/env bash
# Debootstrapped roots holding the daemons of the newer Ceph releases Debian offers, for
# tests/ceph/cluster.sh (CEPH_ROOT=<root>). The host (bookworm) has Pacific 16.2.15; Debian has
# no Squid 19.2 in any suite.
#
#   tests/ceph/releases.sh build RELEASE    # builds the root once (cached), prints its path
#   tests/ceph/releases.sh path RELEASE     # prints the root's path; exit 1 when not built
#   tests/ceph/releases.sh version RELEASE  # the Ceph version the root holds (e.g. 18.2.7)
#   tests/ceph/releases.sh list             # the releases this script knows
#
# RELEASE: reef (trixie, 18.2.7) or tentacle (sid, 20.2.4).
# Cached under ${CEPHCSI_CACHE:-~/.cache/cephcsi}/ceph-releases/RELEASE/KEY/root, KEY a hash of
# the suite and the package list: changing the list builds a new root beside the old one. A
# root is only used once its `.complete` stamp exists, so an interrupted build is redone. The
# first build takes ~2-3 min (debootstrap minbase, then ~1.4 GB of packages); a cached one is
# a stat. Needs root (debootstrap, chroot).
set -euo pipefail

CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
# Python 3 venv: a venv inside the root can run the driver with that release's client.
PACKAGES=(ceph-mon ceph-mgr ceph-osd ceph-common python3-rados python3-rbd rbd-fuse uuid-runtime python3-venv)
# Debian trixie's Reef mgr (18.2.7 on Python 3.13) is broken in two ways upstream Reef builds
# (Python 3.9) are not; the driver hands image purges and flattens to its rbd_support module:
# 1. it loads no module at all: mgr_util imports bcrypt, and trixie's python3-bcrypt 4.2 is a PyO3
#    module, which refuses the mgr's subinterpreters ("PyO3 modules do not yet support
#    subinterpreters", ceph tracker 64213). The root gets bcrypt 3.2.2 (cffi, abi3) from PyPI in
#    place of Debian's, pinned by hash.
# 2. rbd_support's progress callback, which librbd calls from its own thread, segfaults the mgr
#    (_PyType_LookupRef under PyObject_GetAttr: Reef's subinterpreter handling predates 3.12's
#    per-interpreter state) on the first `rbd task add trash remove` or `flatten` of an image
#    with data objects. The root's rbd_support passes no progress callback (the task then runs
#    without progress reports, which the driver does not read).
# Tentacle (mgr_subinterpreter_modules, the Gil fixes) needs neither.
REEF_BCRYPT="bcrypt==3.2.2 --hash=sha256:2b02d6bfc6336d1094276f3f588aa1225a598e27f8e3388f4db9948cb707b521"
REEF_FIXES="$REEF_BCRYPT; rbd_support on_progress=None"

usage() { echo "usage: releases.sh build|path|version RELEASE | list" >&2; exit 2; }

suite_of() {
  case "$1" in
    reef) echo trixie ;;
    tentacle) echo sid ;;
    *) echo "releases.sh: unknown Ceph release '$1' (reef, tentacle; pacific is the host's own)" >&2; exit 2 ;;
  esac
}

# The mirror the host's apt uses (deb822 or one-line sources), so no other host is needed.
mirror() {
  local uri
  uri=$(grep -rhoE '^URIs:[[:space:]]*https?://[^[:space:]]*/debian/?$' /etc/apt/sources.list.d/ 2>/dev/null | head -1 | awk '{print $2}' || true)
  [[ -n $uri ]] || uri=$(grep -rhoE '^deb[[:space:]]+https?://[^[:space:]]*/debian/?[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -1 | awk '{print $2}' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

base_of() {  # the folder of RELEASE's root for the current package list
  local suite key
  suite=$(suite_of "$1")
  local extra=""
  [[ $1 != reef ]] || extra=$REEF_FIXES
  key=$(printf '%s %s %s\n' "$suite" "${PACKAGES[*]}" "$extra" | sha256sum | cut -c1-12)
  echo "$CACHE_ROOT/ceph-releases/$1/$key"
}

# Mount points under DIR (deepest first): a root is never deleted while something is mounted in
# it (a bind-mounted /dev would be emptied by rm -rf).
mounts_under() {
  findmnt -rn -o TARGET | awk -v d="$1/" 'index($0 "/", d) == 1' | sort -r
}

# The pip of this checkout's venv (scripts/setup.sh makes it before it builds the roots), or any.
pip_cmd() {
  local venv_pip
  venv_pip="$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/pip"
  if [[ -x $venv_pip ]]; then echo "$venv_pip"; else echo "python3 -m pip"; fi
}

fix_reef_mgr() {  # fix_reef_mgr ROOT BASE: see REEF_BCRYPT
  local tmp=$1 base=$2 wheels=$2/wheels
  rm -rf "$wheels"
  mkdir -p "$wheels"
  echo "$REEF_BCRYPT" >"$wheels/requirements.txt"
  $(pip_cmd) download -q --no-deps --require-hashes --only-binary=:all: --python-version 3.13 \
    --implementation cp --platform manylinux2014_x86_64 -r "$wheels/requirements.txt" -d "$wheels" >&2
  local site=$tmp/usr/lib/python3/dist-packages
  rm -rf "$site/bcrypt"
  python3 -m zipfile -e "$wheels"/bcrypt-*.whl "$wheels/unpacked"
  cp -r "$wheels/unpacked/bcrypt" "$site/bcrypt"
  chroot "$tmp" python3 -c 'import bcrypt; assert bcrypt.__version__ == "3.2.2"'
  local task=$tmp/usr/share/ceph/mgr/rbd_support/task.py
  local callback='on_progress=partial(self.progress_callback, task)'
  [[ $(grep -cF "$callback" "$task") == 6 ]] \
    || { echo "releases.sh: rbd_support/task.py is not the one this fix was written for" >&2; exit 1; }
  sed -i "s/on_progress=partial(self.progress_callback, task)/on_progress=None/" "$task"
}

build() {
  local release=$1 suite base root tmp
  suite=$(suite_of "$release")
  base=$(base_of "$release")
  root=$base/root
  if [[ -f $base/.complete ]]; then echo "$root"; return 0; fi
  mkdir -p "$base"
  exec 9>"$base/.lock"
  flock 9
  if [[ -f $base/.complete ]]; then echo "$root"; return 0; fi
  [[ $(id -u) == 0 ]] || { echo "releases.sh: building a root needs root (debootstrap, chroot)" >&2; exit 1; }
  command -v debootstrap >/dev/null || { echo "releases.sh: debootstrap is missing (scripts/setup.sh installs it)" >&2; exit 1; }
  tmp=$base/root.tmp
  if [[ -n $(mounts_under "$tmp") ]]; then
    mounts_under "$tmp" | while read -r m; do umount "$m"; done
  fi
  rm -rf "$tmp"
  local url
  url=$(mirror)
  echo "releases.sh: debootstrap $suite from $url into $tmp" >&2
  debootstrap --variant=minbase "$suite" "$tmp" "$url" >"$base/debootstrap.log" 2>&1 \
    || { tail -20 "$base/debootstrap.log" >&2; exit 1; }
  # No daemon may start inside the root while packages install; sid/trixie archives may be
  # older than their Valid-Until on a machine whose clock runs ahead of the mirror snapshot.
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 755 "$tmp/usr/sbin/policy-rc.d"
  printf 'Acquire::Check-Valid-Until "false";\nAPT::Install-Recommends "false";\n' >"$tmp/etc/apt/apt.conf.d/90cephcsi"
  mount -t proc proc "$tmp/proc"
  trap 'umount "'"$tmp"'/proc" 2>/dev/null || true' EXIT
  echo "releases.sh: installing ${PACKAGES[*]}" >&2
  if ! chroot "$tmp" env DEBIAN_FRONTEND=noninteractive LC_ALL=C sh -c \
      "apt-get update -qq && apt-get install -y -qq --no-install-recommends ${PACKAGES[*]}" >"$base/apt.log" 2>&1; then
    tail -20 "$base/apt.log" >&2
    exit 1
  fi
  chroot "$tmp" apt-get clean
  if [[ $release == reef ]]; then fix_reef_mgr "$tmp" "$base"; fi
  umount "$tmp/proc"
  trap - EXIT
  local version
  version=$(chroot "$tmp" ceph --version | awk '{print $3}')
  [[ -n $version ]] || { echo "releases.sh: no ceph in the built root" >&2; exit 1; }
  echo "$version" >"$base/version"
  rm -rf "$root"
  mv "$tmp" "$root"
  touch "$base/.complete"
  # Roots of an older package list go, unless a cluster still runs from one.
  local old
  for old in "$(dirname "$base")"/*/; do
    old=${old%/}
    [[ $old != "$base" && -z $(mounts_under "$old") ]] || continue
    rm -rf --one-file-system "$old"
  done
  echo "releases.sh: $release $version ready in $root" >&2
  echo "$root"
}

cmd="${1:-}"
case "$cmd" in
  build) build "${2:?release}" ;;
  path)
    base=$(base_of "${2:?release}")
    [[ -f $base/.complete ]] || { echo "releases.sh: $2 is not built (tests/ceph/releases.sh build $2)" >&2; exit 1; }
    echo "$base/root" ;;
  version)
    base=$(base_of "${2:?release}")
    [[ -f $base/.complete ]] || { echo "releases.sh: $2 is not built" >&2; exit 1; }
    cat "$base/version" ;;
  list) echo reef tentacle ;;
  *) usage ;;
esac
