#!/usr/bin/env bash
# Builds the Vault server the encryption tests run against (tests/integration/encryption) into a
# cache outside the repository, keyed by version; prints the binary's path. A second run only checks.
#
# Which server: OpenBao (the MPL fork of Vault) would be the first choice, but the Go module proxy
# this project reaches refuses github.com/openbao/openbao (403 for every version) and Debian ships
# neither. HashiCorp Vault v1.14.1 is the last release line published under MPL-2.0 (OpenBao forked
# from it) and the proxy serves it; its HTTP API (token auth, KV v1/v2, sys/mounts) is what ceph-csi's
# vault and vaulttokens KMS types speak.
#
# Why not `go install ...@version`: Vault's go.mod replaces its api/ and sdk/ modules with ./api and
# ./sdk, which are nested modules and so absent from the module zip (and the proxy will not resolve
# the tag's commit for them). api's replace lines are dropped (its required v1.9.2 is a tagged
# release). sdk: the pseudo-version v1.14.1's go.mod requires predates code its tree uses, so ./sdk
# becomes sdk/v0.9.2, the first tag with all of it, less one start-up check that tag added later
# ("defines a CreateOperation but no ExistenceCheck", which a v1.14.1 path trips: it would panic).
# Both modules stay MPL-2.0.
set -euo pipefail

VAULT_VERSION="${VAULT_VERSION:-v1.14.1}"
VAULT_SDK_VERSION="${VAULT_SDK_VERSION:-v0.9.2}"
CACHE_ROOT="${CEPHCSI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephcsi}"
OUT="$CACHE_ROOT/vault/$VAULT_VERSION"
BIN="$OUT/bin/vault"

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
# 2 shared cores: one compiler process at a time keeps the machine usable (~10 min the first time).
export GOMAXPROCS="${GOMAXPROCS:-1}"
src=$(go mod download -json "github.com/hashicorp/vault@$VAULT_VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
work="$OUT/src"
rm -rf "$work"
cp -r "$src" "$work"
chmod -R u+w "$work"
cd "$work"
mapfile -t local_replaces < <(grep -E '^replace .* => \./api' go.mod | awk '{print $2}')
for mod in "${local_replaces[@]}"; do go mod edit -dropreplace="$mod"; done
sdk=$(go mod download -json "github.com/hashicorp/vault/sdk@$VAULT_SDK_VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$sdk" sdk
chmod -R u+w sdk
check='panic(fmt.Sprintf("Pattern %v defines a CreateOperation but no ExistenceCheck", p.Pattern))'
grep -qF "$check" sdk/framework/backend.go
sed -i "s|$check|_ = p // removed for v1.14.1 (scripts/build_vault.sh)|" sdk/framework/backend.go
if grep -qF "$check" sdk/framework/backend.go; then echo "build_vault.sh: patching sdk failed" >&2; exit 1; fi
grep -q '^replace github.com/hashicorp/vault/sdk => ./sdk' go.mod
mkdir -p "$OUT/bin"
# -checklinkname=0: some of v1.14's pinned dependencies reach runtime internals through
# go:linkname, which Go >= 1.23 refuses to link by default.
nice -n 10 go build -p 1 -trimpath -ldflags "-s -w -checklinkname=0" -o "$BIN.tmp" .
mv "$BIN.tmp" "$BIN"
rm -rf "$work"
echo "$BIN"
