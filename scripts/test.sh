#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, multi-rank under mpirun, PyTorch reference,
# the fault suite and bad-input corpus), the fuzzers and the host-run CUDA kernels under
# clang's sanitizers. ctest runs tests on every core; the ones that start several ranks are
# RUN_SERIAL (tests/CMakeLists.txt), so no two of them share the cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --all "$@"
cd build
ctest --output-on-failure --timeout 900 -j"$(nproc)"
# The readers of untrusted files under libFuzzer, 20 s each (docs/fuzzing.md).
bash ../scripts/fuzz.sh 20
# The CUDA kernels on the host under ThreadSanitizer and AddressSanitizer (docs/cuda.md,
# "Checked on the host").
bash ../scripts/sanitize.sh
