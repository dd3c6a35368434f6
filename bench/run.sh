#!/usr/bin/env bash
# The one benchmark command: `bench/run.sh [--quick] [flags]` = `.venv/bin/python -m bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m bench "$@"
