#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) into build-fuzz/ and runs
# each for SECONDS (default 20) on a scratch copy of its seed corpus, so the committed corpus
# never grows. Exits 1 when any target finds a crash, sanitizer report, uncaught exception,
# timeout or huge allocation, and prints the reproducer's path (docs/fuzzing.md).
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]     TARGET: config safetensors token_shard checkpoint
# Environment: FUZZ_BUILD_JOBS (default: nproc), FUZZ_FLAGS (extra libFuzzer flags, e.g.
# "-jobs=4 -workers=4"), FUZZ_RSS_LIMIT_MB (default 2048), FUZZ_TIMEOUT_S (per input, default 10).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config safetensors token_shard checkpoint)
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "fuzz: SECONDS must be a positive integer, got '$seconds'" >&2
  exit 2
fi
for target in "${targets[@]}"; do
  if [ ! -f "tests/fuzz/fuzz_${target}.cpp" ]; then
    echo "fuzz: unknown target '$target' (config, safetensors, token_shard, checkpoint)" >&2
    exit 2
  fi
done
if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; run scripts/setup.sh --all (it installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi

root=$(pwd)
build="build-fuzz"
jobs=${FUZZ_BUILD_JOBS:-$(nproc)}
start=$(date +%s)
mkdir -p "$build"
{
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DULYSSES_CUDA=OFF -DBUILD_TESTING=OFF -DULYSSES_FUZZ=ON &&
    cmake --build "$build" --target fuzzers -j"$jobs"
} >"$build/fuzz-build.log" 2>&1 || {
  tail -n 40 "$build/fuzz-build.log" >&2
  echo "fuzz: configuring or building $build failed (log: $build/fuzz-build.log)" >&2
  exit 2
}
echo "fuzz: built the fuzz targets in $(($(date +%s) - start)) s"

runs="$build/fuzz-runs"
failed=()
for target in "${targets[@]}"; do
  work="$runs/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp tests/fuzz/corpus/"$target"/* "$work/corpus/"
  case "$target" in
    config) dict=tests/fuzz/config.dict ;;
    token_shard) dict=tests/fuzz/token_shard.dict ;;
    *) dict=tests/fuzz/json.dict ;;
  esac
  status=0
  # Run inside the scratch folder: with -jobs, libFuzzer writes fuzz-<n>.log to the current one.
  # shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags
  (cd "$work" && "$root/$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" \
    -rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" -timeout="${FUZZ_TIMEOUT_S:-10}" \
    -dict="$root/$dict" -artifact_prefix="$root/$work/artifacts/" -print_final_stats=1 \
    ${FUZZ_FLAGS:-} corpus) >"$work/log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -n 1)
  artifacts=$(find "$work/artifacts" -type f | sort)
  if [ "$status" -ne 0 ] || [ -n "$artifacts" ]; then
    failed+=("$target")
    echo "fuzz: $target FAILED (exit $status) after ${execs:-?} runs; log: $work/log" >&2
    grep -E "ERROR: |runtime error|fuzz invariant|SUMMARY|uncaught|terminate" "$work/log" |
      head -n 10 >&2 || true
    for artifact in $artifacts; do
      echo "fuzz: reproducer: $artifact" >&2
      echo "      rerun with: $build/tests/fuzz/fuzz_$target $artifact" >&2
    done
  else
    echo "fuzz: $target ok: ${execs:-?} runs in ${seconds} s (${rate:-?} exec/s)," \
      "corpus $(find "$work/corpus" -type f | wc -l) inputs"
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (docs/fuzzing.md: reproducing and adding to the corpus)" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ok"
