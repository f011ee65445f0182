#!/usr/bin/env bash
# Every GPU check in one command, for a short loan of a GPU machine (docs/cuda.md, "What ran on
# a GPU"): the checks run in the order of what they decide, each under its own timeout, each
# logging into its own file under OUT as it goes (so a loan that ends early keeps what ran),
# then one summary line per check. With a packed build (scripts/gpu-check.sh --build-dir):
#   1. scripts/gpu-check.sh: the GPU tests, the attention kernels alone, the Llama-1B table
#      (its cuDNN rows have the auto loss tile);
#   2. the loss tile: the Llama-1B cuDNN runs again with memory.loss_tile_tokens 256, the loss
#      phase's device time against step 1's rows (scripts/gpu_table.py --set);
#   3. scripts/bench-startup.sh --runs 2: launch to "parameters" and to step 1, 1.1 B on cuda;
#   4. scripts/bench-device-timing.sh: what timing phases on the device costs.
# The timeouts add up to 570 s, under the 600 s a device command may take. DIR must hold the
# binaries `scripts/gpu-check.sh --binaries` lists (pack them with the build).
# Usage: scripts/gpu-session.sh --build-dir DIR --out DIR
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=""
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=${2:?gpu-session: --build-dir needs a folder}; shift 2 ;;
    --out) OUT=${2:?gpu-session: --out needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-session: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$BUILD" ] && [ -n "$OUT" ] || { echo "gpu-session: --build-dir and --out are needed" >&2; exit 2; }
# Every binary the checks run, before the loan's time goes into any of them.
missing=()
for binary in $(scripts/gpu-check.sh --binaries); do
  [ -x "$BUILD/$binary" ] || [ "$binary" = tests/test_cudnn_graphs ] || missing+=("$binary")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-session: not in $BUILD (pack them with the build): ${missing[*]}" >&2
  exit 2
fi
mkdir -p "$OUT"

SUMMARY=()
# step NAME SECONDS COMMAND...: runs one check into OUT/NAME.log, output also on the console.
step() {
  local name=$1 seconds=$2 started=$SECONDS
  shift 2
  echo "== $name (at most ${seconds} s)"
  timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
  local status=${PIPESTATUS[0]}
  local verdict="ok"
  [ "$status" -eq 0 ] || verdict="FAILED (exit $status$([ "$status" -eq 124 ] && echo ', timed out'))"
  SUMMARY+=("$name: $verdict in $((SECONDS - started)) s")
}

step 1-gpu-check 360 scripts/gpu-check.sh --build-dir "$BUILD" --logs "$OUT/gpu-check"
step 2-loss-tile-256 80 python3 scripts/gpu_table.py --binary "$BUILD/apps/ulysses-train" \
  --logs "$OUT/loss-tile-256" --rows cudnn --set memory.loss_tile_tokens=256
step 3-startup 70 scripts/bench-startup.sh --build-dir "$BUILD" --runs 2
step 4-device-timing 60 scripts/bench-device-timing.sh --binary "$BUILD/apps/ulysses-train"

echo "== summary"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
! grep -q FAILED "$OUT/summary.txt"
