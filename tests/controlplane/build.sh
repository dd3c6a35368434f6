#!/usr/bin/env bash
# Builds etcd, kube-apiserver and kube-controller-manager from the Go module proxy into a
# cache outside the repository, keyed by version, so a machine pays for the build once.
#
# Why a wrapper module: k8s.io/kubernetes pins its staging modules (k8s.io/api, client-go, ...)
# at v0.0.0 with `replace => ./staging/...`, so `go install k8s.io/kubernetes/cmd/...@v` cannot
# resolve them. The wrapper requires k8s.io/kubernetes and replaces every staging module with its
# published v0.X.Y, which is the same source.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"
CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
OUT="$CACHE_ROOT/controlplane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
BIN="$OUT/bin"

if [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" && -x "$BIN/etcd" ]]; then
  echo "$BIN"
  exit 0
fi

# One builder at a time per cache folder (setup and a test run may both ask for it).
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" && -x "$BIN/etcd" ]]; then
  echo "$BIN"
  exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
work="$OUT/src"
rm -rf "$work"
mkdir -p "$work" "$BIN"
cd "$work"

staging_minor="v0.${K8S_VERSION#v1.}"
k8s_gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
# Every k8s.io/<name> => ./staging/... line of that tag's go.mod becomes a replace to the published module.
mapfile -t staging < <(grep -E '^\s*k8s\.io/[a-z0-9-]+\s+=>\s+\./staging/' "$k8s_gomod" | awk '{print $1}' | grep -v '^k8s.io/sample-' | sort -u)
{
  echo "module cephcsi.test/controlplane"
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

package controlplane

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
go mod tidy >/dev/null 2>&1 || go mod tidy
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3
mv "$BIN/etcd.tmp" "$BIN/etcd"
for cmd in kube-apiserver kube-controller-manager; do
  go build -trimpath -ldflags "$ldflags" -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$BIN/$cmd.tmp" "$BIN/$cmd"
done
echo "$BIN"
