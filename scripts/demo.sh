#!/usr/bin/env bash
# Sets everything up and runs the demo: the built-in engine with the seed-h200
# profile, the seed's matrix, and its report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec speedmatrix demo "$@"
