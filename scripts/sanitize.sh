#!/usr/bin/env bash
# Runs the CUDA kernels on the host (tests/cuda_emulation.h: one std::thread per GPU thread)
# under clang's sanitizers (docs/cuda.md, "Checked on the host"):
#   thread   ThreadSanitizer. Two GPU threads that touch the same shared memory with no barrier
#            between are two host threads racing here, reported from the order of barriers,
#            whatever order the threads happened to run in: a missing __syncthreads fails even
#            when the results come out right.
#   address  AddressSanitizer. A kernel that reads or writes global memory outside its tensors
#            (a tile edge one row too far, even one whose values are masked) reads outside a
#            host buffer here.
# Builds build-sanitize/ (clang, whose ThreadSanitizer ran these tests 2.7x faster than gcc 12's
# on the 2-core CI machine; no CUDA; the libraries once, uninstrumented, and the tests'
# code once per sanitizer: <test>_tsan, <test>_asan, tests/CMakeLists.txt) and runs the
# emulated attention kernels, the emulation's hazard checks and the op table's column of every
# kernel on the host; address also runs the emulated training steps (every kernel at a model's
# shapes: too slow under thread). Exits 1 on a report or a failed test.
#
# Usage: scripts/sanitize.sh [thread] [address]     (default: both)
# Environment: SANITIZE_BUILD_JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizers=("$@")
[ ${#sanitizers[@]} -eq 0 ] && sanitizers=(thread address)
for sanitizer in "${sanitizers[@]}"; do
  case "$sanitizer" in
    thread | address) ;;
    *) echo "sanitize: unknown sanitizer '$sanitizer' (thread, address)" >&2; exit 2 ;;
  esac
done
if ! command -v clang++ >/dev/null; then
  echo "sanitize: clang++ not found; run scripts/setup.sh --all (it installs clang)" >&2
  exit 2
fi
# The instrumented tests of each sanitizer, as tests/CMakeLists.txt names them.
kernel_tests="test_cuda_attention_emulated test_cuda_emulation_hazards test_backend_ops"
declare -A tests_of=(
  [thread]="$(printf '%s_tsan ' $kernel_tests)"
  [address]="$(printf '%s_asan ' $kernel_tests test_emulated_cuda_training)"
)
# The build's jobs, counted before OMP_NUM_THREADS=1 is set below: nproc honours it.
build_jobs=${SANITIZE_BUILD_JOBS:-$(nproc)}
# One OpenMP and one OpenBLAS thread: their pools are not instrumented (the libraries are not,
# tests/CMakeLists.txt), and the emulation's threads are the ones to check.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ignore_noninstrumented_modules=1 ${TSAN_OPTIONS:-}"
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=0 ${ASAN_OPTIONS:-}"
build="build-sanitize"
targets=()
for sanitizer in "${sanitizers[@]}"; do
  read -r -a tests <<<"${tests_of[$sanitizer]}"
  targets+=("${tests[@]}")
done
start=$(date +%s)
mkdir -p "$build"
{
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DULYSSES_CUDA=OFF &&
    cmake --build "$build" --target "${targets[@]}" -j"$build_jobs"
} >"$build/sanitize-build.log" 2>&1 || {
  tail -n 40 "$build/sanitize-build.log" >&2
  echo "sanitize: configuring or building $build failed (log: $build/sanitize-build.log)" >&2
  exit 2
}
echo "sanitize: built ${targets[*]} in $(($(date +%s) - start)) s"
failed=()
for sanitizer in "${sanitizers[@]}"; do
  read -r -a tests <<<"${tests_of[$sanitizer]}"
  for test in "${tests[@]}"; do
    filter="*"
    [[ "$test" = test_backend_ops_* ]] && filter="*cuda_kernels_on_host*"
    log="$build/$test.log"
    begin=$(date +%s)
    if "$build/tests/$test" --gtest_filter="$filter" >"$log" 2>&1; then
      echo "sanitize ($sanitizer): $test passed in $(($(date +%s) - begin)) s"
    else
      grep -m 3 -E "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|SUMMARY|FAILED" "$log" >&2 || true
      echo "sanitize ($sanitizer): $test failed (log: $log)" >&2
      failed+=("$sanitizer: $test")
    fi
  done
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'sanitize: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
