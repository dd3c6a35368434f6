#!/usr/bin/env bash
# One set-up command for a fresh Debian bookworm machine (root): Debian packages, Go tools,
# the Python venv with cephcsi installed editable, and the real test peers (Ceph packages,
# csi-sanity, a Go-built etcd + kube-apiserver + kube-controller-manager cached outside the repo).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

CSI_SANITY_VERSION="${CSI_SANITY_VERSION:-v5.6.0}"
VENV="${VENV:-.venv}"

log() { printf '[setup] %s\n' "$*"; }

# Kept in one place so the Dockerfile installs exactly the same runtime packages; an
# unsupported Debian release stops here (set -e), it never yields an empty list.
deb_list=$(scripts/packages.sh runtime test)
mapfile -t deb_packages <<<"$deb_list"

missing=()
for pkg in "${deb_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's rados/rbd bindings are built for CPython 3.11; PyPI has none.
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || { echo "cephcsi needs Python 3.11 (Debian's rados/rbd bindings are built for it)" >&2; exit 1; }
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
# Only the two binding modules are linked in, not all of Debian's dist-packages.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
for mod in rados rbd; do
  so=$(ls /usr/lib/python3/dist-packages/$mod.cpython-311-*.so)
  ln -sf "$so" "$site/$(basename "$so")"
done
log "installing cephcsi (editable) and test dependencies"
"$VENV/bin/pip" install -q -e '.[test]'
"$VENV/bin/python" -c 'import rados, rbd, cephcsi._generated.csi_pb2'

export GOTOOLCHAIN=local
GOBIN="$(go env GOPATH)/bin"
# csi-sanity prints "(dev)" as its version; the module version is in the binary's build info.
if ! go version -m "$GOBIN/csi-sanity" 2>/dev/null | grep -q "csi-test/v5[[:space:]]*$CSI_SANITY_VERSION"; then
  log "go install csi-sanity@$CSI_SANITY_VERSION"
  go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_SANITY_VERSION"
fi

log "building the test control plane (cached after the first run)"
tests/controlplane/build.sh >/dev/null
# After the control plane: same modules, so its Go build cache makes this ~1 min (e2e node:
# kubelet, kube-scheduler, kubectl, a static pause image; containerd/runc/CNI from Debian).
log "building the e2e node binaries (cached after the first run)"
tests/e2e/node/build.sh >/dev/null
# Snapshot CRDs and the upstream snapshot-controller, from the external-snapshotter module
# (~4 min on 2 cores the first time; cached outside the repo like the control plane).
log "fetching the snapshot CRDs and building snapshot-controller (cached after the first run)"
tests/controlplane/snapshotter_build.sh >/dev/null
# bench/'s Go gRPC caller (section 1; its integration test runs it): a few seconds, cached by its sources.
log "building bench/grpccaller (cached after the first run)"
"$VENV/bin/python" -c "from bench import go_caller; go_caller.build()"
# The Vault server of the vault/vaulttokens KMS tests (tests/integration/encryption): Vault v1.14.1
# (MPL-2.0) from the Go module proxy, ~15 min on 2 cores the first time, cached outside the repo.
log "building the Vault test server (cached after the first run)"
scripts/build_vault.sh >/dev/null
# The real-kernel VM node of tests/vm (krbd, rbd-nbd): a debootstrapped bookworm disk image with
# the driver's dependencies, cached by a hash of its recipe (~3-4 minutes the first time).
log "building the VM test node image (cached after the first run)"
PYTHON="$(cd "$VENV" && pwd)/bin/python" tests/vm/build_image.sh >/dev/null
# Reef 18.2.7 and Tentacle 20.2.4 daemons for scripts/test.sh's release sessions: debootstrapped
# roots (~3-4 min each the first time), cached outside the repo like the control plane.
for release in $(tests/ceph/releases.sh list); do
  log "building the Ceph $release root (cached after the first run)"
  tests/ceph/releases.sh build "$release" >/dev/null
done
# The stock-Tentacle session runs pytest inside the sid root with Tentacle's own client (the only
# one here that reads aes256k keys): its venv of the driver's dependencies, from PyPI wheels for
# the root's Python 3.14 (cached by the dependency list; `--version` only prepares it).
log "preparing the test venv inside the Ceph tentacle root (cached after the first run)"
tests/ceph/in_root.sh tentacle --version >/dev/null
log "done"
