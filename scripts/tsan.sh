#!/usr/bin/env bash
# Runs the CUDA kernels on the host (tests/cuda_emulation.h: one std::thread per GPU thread)
# under ThreadSanitizer. Two GPU threads that touch the same shared memory with no barrier
# between are two host threads racing here, and ThreadSanitizer reports the race from the
# order of barriers, whatever order the threads happened to run in; so a missing
# __syncthreads in a kernel fails here even when its results come out right
# (docs/cuda.md, "Checked on the host"). Builds build-tsan/ (clang, -fsanitize=thread, no
# CUDA) and runs the emulated attention kernels, the emulation's own hazard checks and the op
# table's column of every kernel on the host. Exits 1 on a race or a failed test.
#
# Usage: scripts/tsan.sh
# Environment: TSAN_BUILD_JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang++ >/dev/null; then
  echo "tsan: clang++ not found; run scripts/setup.sh --all (it installs clang)" >&2
  exit 2
fi
build="build-tsan"
tests=(test_cuda_attention_emulated test_cuda_emulation_hazards test_backend_ops)
start=$(date +%s)
mkdir -p "$build"
{
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DULYSSES_CUDA=OFF -DULYSSES_SANITIZE=thread &&
    cmake --build "$build" --target "${tests[@]}" -j"${TSAN_BUILD_JOBS:-$(nproc)}"
} >"$build/tsan-build.log" 2>&1 || {
  tail -n 40 "$build/tsan-build.log" >&2
  echo "tsan: configuring or building $build failed (log: $build/tsan-build.log)" >&2
  exit 2
}
echo "tsan: built ${tests[*]} in $(($(date +%s) - start)) s"

# One OpenMP and one OpenBLAS thread: their pools are not instrumented, and the emulation's
# threads are the ones to check.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ignore_noninstrumented_modules=1 ${TSAN_OPTIONS:-}"
failed=()
for test in "${tests[@]}"; do
  filter="*"
  [ "$test" = test_backend_ops ] && filter="*cuda_kernels_on_host*"
  log="$build/$test.log"
  begin=$(date +%s)
  if "$build/tests/$test" --gtest_filter="$filter" >"$log" 2>&1; then
    echo "tsan: $test passed in $(($(date +%s) - begin)) s"
  else
    grep -m 3 -E "WARNING: ThreadSanitizer|SUMMARY|FAILED" "$log" >&2 || true
    echo "tsan: $test failed (log: $log)" >&2
    failed+=("$test")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "tsan: failed: ${failed[*]}" >&2
  exit 1
fi
