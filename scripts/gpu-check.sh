#!/usr/bin/env bash
# GPU check for one machine with one GPU, in under 5 minutes on an H200 (docs/cuda.md):
#   1. the op table's GPU column first (tests/test_backend_ops.cpp), then the GPU tests (a skip
#      counts as a failure), including two ranks sharing the GPU through MPI staged via the
#      host (sp = 2);
#   2. the attention kernels alone (apps/ulysses_bench_attention.cpp): the native tensor-core
#      kernels against cuDNN's, forward and backward device-timed apart, head dims 64 and 128
#      at 8K and 32K tokens, with native's throughput as a share of cuDNN's;
#   3. one table for a Llama-1B-shaped model at 8K and 32K tokens (scripts/gpu_table.py):
#      cuDNN attention, the native kernels and layer checkpointing, each with tokens/s, step
#      ms, model FLOP/s as a share of the H200's 989 TFLOP/s bf16 peak, the device's busy
#      share, the rate of the step's GEMM phases beside cuBLASLt's alone on the layer's GEMM
#      shapes, the peak tracked memory and the planner's prediction beside it; where
#      `python3 -c 'import torch'` finds a GPU, the PyTorch peer on the same shapes
#      (scripts/bench_torch_llama.py) and the ratio. Each run's end-of-run table (device time,
#      each phase's share and TFLOP/s) and verdict are printed above the table.
# Usage: scripts/gpu-check.sh [--build-dir DIR] [--logs DIR] [--skip-tests] [--skip-torch]
#        scripts/gpu-check.sh --binaries   (the build's binaries it runs, one per line; the
#                                          last, test_cudnn_graphs, only where cuDNN is)
#   --build-dir DIR  an existing Release build with CUDA: used as it is, nothing is configured
#                    or built (a machine without the build's libraries can run it)
#   otherwise        configures and builds into build-gpu first
#   --logs DIR       keep every test's and run's log and metrics there (default: a temporary
#                    folder, removed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
TEST_BINARIES=(tests/test_backend_ops tests/test_cuda_ops tests/test_cuda_training
               tests/test_cuda_profiling tests/mpi/staged_comm_test tests/mpi/staged_training_test)
BINARIES=(apps/ulysses-train apps/ulysses-bench-attention apps/ulysses-bench-gemm
          "${TEST_BINARIES[@]}")
BUILD=""
KEEP_LOGS=""
RUN_TESTS=1
RUN_TORCH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=${2:?gpu-check: --build-dir needs a folder}; shift 2 ;;
    --binaries) printf '%s\n' "${BINARIES[@]}" tests/test_cudnn_graphs; exit 0 ;;
    --logs) KEEP_LOGS=${2:?gpu-check: --logs needs a folder}; shift 2 ;;
    --skip-tests) RUN_TESTS=0; shift ;;
    --skip-torch) RUN_TORCH=0; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU: nvidia-smi is missing or lists no device; this check needs one" >&2
  exit 1
fi
nvidia-smi -L | head -1

if [ -z "$BUILD" ]; then
  BUILD=build-gpu
  echo "== build (Release, CUDA on) into $BUILD"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DULYSSES_CUDA=ON >"$BUILD.configure.log" 2>&1 ||
    { cat "$BUILD.configure.log"; exit 1; }
  targets=()
  for binary in "${BINARIES[@]}"; do targets+=("$(basename "$binary")"); done
  cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}" >"$BUILD.build.log" 2>&1 ||
    { tail -50 "$BUILD.build.log"; exit 1; }
else
  echo "== prebuilt: $BUILD"
fi
for binary in "${BINARIES[@]}"; do
  [ -x "$BUILD/$binary" ] || { echo "gpu-check: $BUILD/$binary is not built" >&2; exit 1; }
done
if [ -n "$KEEP_LOGS" ]; then
  LOGS=$KEEP_LOGS
  mkdir -p "$LOGS"
else
  LOGS=$(mktemp -d)
  trap 'rm -rf "$LOGS"' EXIT
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# check NAME COMMAND...: runs a GPU test binary; a failure, a skip or a timeout fails the check.
FAILED=()
check() {
  local name=$1 log="$LOGS/$(printf %s "$1" | tr -c "A-Za-z0-9_.-" _).log"
  shift
  echo "-- $name"
  if ! timeout 180 "$@" --gtest_brief=1 >"$log" 2>&1 || grep -q "SKIPPED\|FAILED" "$log"; then
    tail -30 "$log"
    FAILED+=("$name")
  else
    grep -E "PASSED|tests ran" "$log" | tail -2
  fi
}
if ((RUN_TESTS)); then
  echo "== GPU tests"
  # First the op table's GPU column: every op against its double reference on the device.
  check "op table (cuda_on_gpu)" "$BUILD/tests/test_backend_ops" --gtest_filter='*/cuda_on_gpu'
  check test_cuda_ops "$BUILD/tests/test_cuda_ops"
  check test_cuda_training "$BUILD/tests/test_cuda_training"
  # Device time: the phases add up to the step; attention's phases match the ops timed alone.
  check test_cuda_profiling "$BUILD/tests/test_cuda_profiling"
  [ -x "$BUILD/tests/test_cudnn_graphs" ] && check test_cudnn_graphs "$BUILD/tests/test_cudnn_graphs"
  check "staged_comm_test (2 ranks, one GPU)" mpirun -np 2 "$BUILD/tests/mpi/staged_comm_test"
  check "staged_training_test (2 ranks, one GPU)" mpirun -np 2 "$BUILD/tests/mpi/staged_training_test"
fi

echo "== attention kernels: native (tensor cores) against cuDNN, device time"
# A failure here (a kernel that does not launch, cuDNN refusing a shape) fails the check.
if ! timeout 240 "$BUILD/apps/ulysses-bench-attention" 8192,32768 64,128; then
  FAILED+=("ulysses-bench-attention")
fi

echo "== Llama-1B shape: 16 layers, d 2048, 32 heads, 8 kv heads, d_ff 8192, vocab 32000"
TORCH=()
if ((RUN_TORCH)) && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  TORCH=(--torch)
fi
if ! python3 scripts/gpu_table.py --binary "$BUILD/apps/ulysses-train" --logs "$LOGS/table" \
    "${TORCH[@]}"; then
  FAILED+=("Llama-1B table")
fi

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu-check: failed: ${FAILED[*]}" >&2
  exit 1
fi
