#!/usr/bin/env bash
# The one test command: unit tests, then the integration tests against the real Ceph cluster,
# the real Kubernetes control plane and csi-sanity, which the test suite starts and stops itself.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m unit` for the fast unit tests only).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
