#!/usr/bin/env bash
# Builds the kubernetes-csi Go sidecars that cephcsi's embedded loops replace, for the memory
# comparison in `python -m bench`. Binaries are cached outside the repository, one folder per
# version: $CACHE/sidecars/<name>-<version>/<name>. Prints one line per sidecar:
#   <name> <version> <binary path>        (built now or cached)
#   <name> - FAILED <reason>              (no candidate version could be built)
#
# Candidate versions, newest first (picked with `go list -m -versions`; the first that builds
# wins). Override with e.g. PROVISIONER_VERSIONS="v5.3.0". A module whose go.mod has replace
# directives (which `go install` refuses) is built inside a throwaway wrapper module that
# requires it and copies its replace directives, so the build uses the release's dependency set.
set -uo pipefail

CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}/sidecars"
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0
ONLY_CACHED="${ONLY_CACHED:-0}"

# name | module | package | candidate versions
SIDECARS=(
  "csi-provisioner|github.com/kubernetes-csi/external-provisioner/v6|cmd/csi-provisioner|${PROVISIONER_VERSIONS:-v6.4.0 v6.3.0}"
  "csi-attacher|github.com/kubernetes-csi/external-attacher/v4|cmd/csi-attacher|${ATTACHER_VERSIONS:-v4.13.0 v4.12.0}"
  "livenessprobe|github.com/kubernetes-csi/livenessprobe|cmd/livenessprobe|${LIVENESSPROBE_VERSIONS:-latest}"
  "csi-node-driver-registrar|github.com/kubernetes-csi/node-driver-registrar|cmd/csi-node-driver-registrar|${REGISTRAR_VERSIONS:-latest}"
)

build_one() {  # name module package version out → 0 when $out/$name exists afterwards
  local name=$1 module=$2 package=$3 version=$4 out=$5 log=$5/build.log
  mkdir -p "$out"
  : >"$log"
  if GOBIN="$out" nice -n 10 go install -trimpath -ldflags "-s -w" "$module/$package@$version" >>"$log" 2>&1; then
    return 0
  fi
  grep -q "replace directives" "$log" || return 1
  local work=$out/src gomod
  rm -rf "$work"; mkdir -p "$work"
  gomod=$(go mod download -json "$module@$version" 2>>"$log" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])') || return 1
  {
    printf 'module cephcsi.bench/sidecar\n\ngo 1.24\n\nrequire %s %s\n\n' "$module" "$version"
    # Only versioned replacements (module => module vX); local paths cannot apply outside the repo.
    python3 - "$gomod" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
lines = []
for block in re.findall(r"^replace\s*\((.*?)^\)", text, re.S | re.M):
    lines += block.splitlines()
lines += [m for m in re.findall(r"^replace\s+([^(\n].*)$", text, re.M)]
for line in lines:
    line = line.split("//")[0].strip()
    if "=>" in line and not line.split("=>")[1].strip().startswith((".", "/")):
        print("replace " + line)
PY
  } >"$work/go.mod"
  printf '//go:build tools\n\npackage sidecar\n\nimport _ "%s/%s"\n' "$module" "$package" >"$work/tools.go"
  (
    cd "$work" &&
    GOFLAGS=-mod=mod go mod tidy &&
    GOFLAGS=-mod=mod nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out/$name" "$module/$package"
  ) >>"$log" 2>&1
}

mkdir -p "$CACHE_ROOT"
for entry in "${SIDECARS[@]}"; do
  IFS='|' read -r name module package versions <<<"$entry"
  done_line=""
  reasons=""
  for version in $versions; do
    out="$CACHE_ROOT/$name-$version"
    if [[ -x $out/$name ]]; then done_line="$name $version $out/$name"; break; fi
    [[ $ONLY_CACHED == 1 ]] && continue
    if build_one "$name" "$module" "$package" "$version" "$out" && [[ -x $out/$name ]]; then
      rm -rf "$out/src"
      done_line="$name $version $out/$name"; break
    fi
    reason=$(grep -m1 -oE '(403 Forbidden|This module version is not available|cannot find module[^;]*|[^ ]+: reading [^:]+: [0-9]+ [A-Za-z ]+)' "$out/build.log" | head -1)
    reasons+="$version: ${reason:-build failed, see $out/build.log}; "
  done
  if [[ -n $done_line ]]; then echo "$done_line"
  elif [[ $ONLY_CACHED == 1 ]]; then echo "$name - FAILED not built yet (run bench/build_sidecars.sh)"
  else echo "$name - FAILED ${reasons%; }"; fi
done
