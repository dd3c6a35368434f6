#!/usr/bin/env bash
# Fetches the snapshot CRDs and builds the upstream snapshot-controller of
# kubernetes-csi/external-snapshotter from the Go module proxy, into a cache outside the
# repository keyed by version (like build.sh for the control plane). Prints the folder, which
# holds bin/snapshot-controller and crd/*.yaml.
#
# Why a copy of the module: its go.mod replaces the client module with `./client`, a folder
# that is a module of its own and so not part of the module zip; the copy points that replace
# at the published client module of the same tag instead (same source), which also holds the CRDs.
set -euo pipefail

SNAPSHOTTER_VERSION="${SNAPSHOTTER_VERSION:-v8.7.0}"
CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
OUT="$CACHE_ROOT/snapshotter/$SNAPSHOTTER_VERSION"
MAIN=github.com/kubernetes-csi/external-snapshotter/v8
CLIENT=github.com/kubernetes-csi/external-snapshotter/client/v8

done_already() { [[ -x "$OUT/bin/snapshot-controller" && -f "$OUT/crd/snapshot.storage.k8s.io_volumesnapshotcontents.yaml"
                   && -f "$OUT/crd/groupsnapshot.storage.k8s.io_volumegroupsnapshotcontents.yaml" ]]; }
if done_already; then echo "$OUT"; exit 0; fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if done_already; then echo "$OUT"; exit 0; fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
dir_of() { go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'; }
client_dir=$(dir_of "$CLIENT@$SNAPSHOTTER_VERSION")

mkdir -p "$OUT/crd" "$OUT/bin"
# The VolumeSnapshot CRDs and the VolumeGroupSnapshot ones (groupsnapshot.storage.k8s.io, GA
# in v8.6; the snapshot-controller serves group snapshots when they exist at its start).
cp "$client_dir"/config/crd/snapshot.storage.k8s.io_*.yaml "$client_dir"/config/crd/groupsnapshot.storage.k8s.io_*.yaml "$OUT/crd/"
# A cache built before the group CRDs were copied keeps its binary.
if done_already; then echo "$OUT"; exit 0; fi
main_dir=$(dir_of "$MAIN@$SNAPSHOTTER_VERSION")
work="$OUT/src"
rm -rf "$work"
cp -r "$main_dir" "$work"
chmod -R u+w "$work"
cd "$work"
go mod edit -replace "$CLIENT=$CLIENT@$SNAPSHOTTER_VERSION"
go build -trimpath -ldflags "-s -w -X main.version=$SNAPSHOTTER_VERSION" -o "$OUT/bin/snapshot-controller.tmp" ./cmd/snapshot-controller
mv "$OUT/bin/snapshot-controller.tmp" "$OUT/bin/snapshot-controller"
rm -rf "$work"
echo "$OUT"
