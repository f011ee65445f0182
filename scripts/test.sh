#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, multi-rank under mpirun, PyTorch reference).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "$@"
cd build
ctest --output-on-failure --timeout 900
