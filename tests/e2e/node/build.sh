#!/usr/bin/env bash
# Builds what the e2e node needs besides the control plane, into a cache outside the repository
# keyed by version, so a machine pays for it once:
#   - kubelet, kube-scheduler and kubectl (kubectl carries kustomize for `kubectl apply -k`), from
#     the Go module proxy with the same wrapper-module trick as tests/controlplane/build.sh;
#   - a static pause binary (the pod sandbox's one process) and a docker-archive image of it,
#     because no registry is reachable and containerd's sandbox image must exist locally;
#   - the Debian packages of the node: containerd, runc, the CNI plugins, iptables.
# Prints the bin folder on its last line (kubelet, kube-scheduler, kubectl, pause, pause.tar).
#
# Run it after tests/controlplane/build.sh (scripts/setup.sh does): the wrapper module requires
# the same modules at the same versions, so the control plane's Go build cache is reused and
# only the node-specific packages compile (~1-2 min on 2 cores instead of ~15).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
OUT="$CACHE_ROOT/node/k8s-$K8S_VERSION"
BIN="$OUT/bin"
HERE="$(cd "$(dirname "$0")" && pwd)"
NODE_DEB_PACKAGES=(containerd runc containernetworking-plugins iptables gcc libc6-dev)
PAUSE_IMAGE="${PAUSE_IMAGE:-cephcsi.test/pause:1}"

missing=()
for pkg in "${NODE_DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "[node] apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq -o DPkg::Lock::Timeout=600
  apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
fi

done_already() {
  [[ -x "$BIN/kubelet" && -x "$BIN/kube-scheduler" && -x "$BIN/kubectl" && -x "$BIN/pause" && -f "$BIN/pause.tar" ]]
}
if done_already; then echo "$BIN"; exit 0; fi

mkdir -p "$OUT" "$BIN"
exec 9>"$OUT/.lock"
flock 9
if done_already; then echo "$BIN"; exit 0; fi

# The pause binary: sleeps in pause() and reaps children, like registry.k8s.io/pause.
if [[ ! -x "$BIN/pause" || ! -f "$BIN/pause.tar" ]]; then
  gcc -static -Os -s -o "$BIN/pause.tmp" "$HERE/pause.c"
  mv "$BIN/pause.tmp" "$BIN/pause"
  python3 "$HERE/pause_image.py" "$BIN/pause" "$PAUSE_IMAGE" "$BIN/pause.tar.tmp"
  mv "$BIN/pause.tar.tmp" "$BIN/pause.tar"
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
work="$OUT/src"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
staging_minor="v0.${K8S_VERSION#v1.}"
k8s_gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
mapfile -t staging < <(grep -E '^\s*k8s\.io/[a-z0-9-]+\s+=>\s+\./staging/' "$k8s_gomod" | awk '{print $1}' | grep -v '^k8s.io/sample-' | sort -u)
# etcd is required too (though not built) so the module graph, and with it every shared
# package's build-cache key, is the control plane's.
{
  echo "module cephcsi.test/node"
  echo
  echo "go 1.24"
  echo
  echo "require ("
  echo "	k8s.io/kubernetes $K8S_VERSION"
  echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  echo ")"
  echo
  echo "replace ("
  for mod in "${staging[@]}"; do echo "	$mod => $mod $staging_minor"; done
  echo ")"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package node

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
go mod tidy >/dev/null 2>&1 || go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
for cmd in kube-scheduler kubelet kubectl; do
  [[ -x "$BIN/$cmd" ]] && continue
  echo "[node] go build $cmd" >&2
  go build -trimpath -ldflags "$ldflags" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$BIN/$cmd.tmp" "$BIN/$cmd"
done
echo "$BIN"
