#!/usr/bin/env bash
# Runs pytest inside a Ceph release root (tests/ceph/releases.sh), with that release's Python and
# Ceph client: Tentacle's python3-rados/rbd (Python 3.14) are the only client here that parses
# the aes256k keys a stock Tentacle >= 20.2.4 cluster makes.
#
#   tests/ceph/in_root.sh RELEASE [PYTEST ARGS...]
#   e.g. tests/ceph/in_root.sh tentacle --ceph-release=tentacle tests/integration/ceph_ops
#
# The checkout is bind-mounted into the root at its own path and pytest runs from it. A venv in
# the root (--system-site-packages, for Debian's rados/rbd bindings) holds the driver's and
# pytest's dependencies, wheels downloaded on the host with pip for the root's Python (the root
# has no CA bundle of its own); a .pth puts the checkout on its path, so the driver runs from the
# work tree as the host venv's editable install does (its generated stubs are the tree's). The
# session's cluster starts inside the root (CEPHCSI_IN_RELEASE_ROOT: no chroot, no bind mounts
# for it), so the release's own daemons and CLI serve it. /proc, /sys, /dev and the checkout are
# unmounted on exit.
set -euo pipefail
release=${1:?usage: in_root.sh RELEASE [PYTEST ARGS...]}
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
root=$("$repo/tests/ceph/releases.sh" build "$release")
pyver=$(chroot "$root" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

# What the venv holds: the runtime dependencies of pyproject.toml and the test runner.
mapfile -t reqs < <("$repo/.venv/bin/python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = ("pytest", "pytest-timeout")
tests = [r for r in project["optional-dependencies"]["test"] if r.split("<")[0].split(">")[0].split("=")[0] in wanted]
print("\n".join(project["dependencies"] + tests))
PY
)
key=$(printf '%s\n' "$pyver" "${reqs[@]}" | sha256sum | cut -c1-12)
venv=/opt/cephcsi-venv-$key
wheels=$(dirname "$root")/wheels-py$pyver-$key

exec 9>"$(dirname "$root")/.venv.lock"
flock 9
if [[ ! -f $root$venv/.complete ]]; then
  echo "in_root.sh: wheels for Python $pyver into $wheels" >&2
  rm -rf "$wheels" "${root:?}$venv"
  mkdir -p "$wheels"
  # Every pin has cp$pyver, abi3 or pure wheels (see pyproject.toml); no source builds in the root.
  "$repo/.venv/bin/pip" download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
    --abi "cp${pyver/./}" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform any -d "$wheels" "${reqs[@]}" >&2
  mkdir -p "$root/opt/wheels"
  mount --bind "$wheels" "$root/opt/wheels"
  rc=0
  chroot "$root" sh -c "python3 -m venv --system-site-packages $venv \
    && $venv/bin/pip install -q --no-index --find-links /opt/wheels $(printf "'%s' " "${reqs[@]}")" || rc=$?
  umount "$root/opt/wheels"
  ((rc == 0)) || exit "$rc"
  site=$(chroot "$root" "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$repo" >"$root$site/cephcsi-worktree.pth"
  touch "$root$venv/.complete"
fi
flock -u 9

mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}"
  done
}
trap cleanup EXIT
for m in /proc /sys /dev "$repo"; do
  mkdir -p "$root$m"
  mount --bind "$m" "$root$m"
  mounts+=("$root$m")
done
rc=0
chroot "$root" env CEPHCSI_IN_RELEASE_ROOT="$release" CEPHCSI_TEST_KEEP_CEPH="${CEPHCSI_TEST_KEEP_CEPH:-}" PYTHONDONTWRITEBYTECODE=1 PATH="$venv/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  sh -c 'cd "$1" && shift && exec python -m pytest -p no:cacheprovider "$@"' in_root "$repo" "$@" || rc=$?
exit "$rc"
