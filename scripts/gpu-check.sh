#!/usr/bin/env bash
# GPU check for one machine with one GPU, in under 5 minutes on an H200 (docs/cuda.md):
#   1. the op table's GPU column first (tests/test_backend_ops.cpp), then the GPU tests (a skip
#      counts as a failure), including two ranks sharing the GPU through MPI staged via the
#      host (sp = 2);
#   2. the attention kernels alone (apps/ulysses_bench_attention.cpp): the native tensor-core
#      kernels against cuDNN's, forward and backward device-timed apart, head dims 64 and 128
#      at 8K and 32K tokens, with native's throughput as a share of cuDNN's;
#   3. one table for a Llama-1B-shaped model at 8K and 32K tokens: cuDNN attention, the native
#      kernels and layer checkpointing, each with tokens/s, step ms, model FLOP/s as a share of
#      the H200's 989 TFLOP/s bf16 peak, the device's busy share, the peak tracked memory and
#      the planner's prediction beside it; where `python3 -c 'import torch'` works, the
#      PyTorch peer on the same shapes (scripts/bench_torch_llama.py) and the ratio.
# Usage: scripts/gpu-check.sh [--build-dir DIR] [--skip-tests] [--skip-torch]
#   --build-dir DIR  an existing Release build with CUDA: used as it is, nothing is configured
#                    or built (a machine without the build's libraries can run it)
#   otherwise        configures and builds into build-gpu first
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=""
RUN_TESTS=1
RUN_TORCH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=${2:?gpu-check: --build-dir needs a folder}; shift 2 ;;
    --skip-tests) RUN_TESTS=0; shift ;;
    --skip-torch) RUN_TORCH=0; shift ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU: nvidia-smi is missing or lists no device; this check needs one" >&2
  exit 1
fi
nvidia-smi -L | head -1

TEST_BINARIES=(tests/test_backend_ops tests/test_cuda_ops tests/test_cuda_training
               tests/test_cuda_profiling tests/mpi/staged_comm_test tests/mpi/staged_training_test)
if [ -z "$BUILD" ]; then
  BUILD=build-gpu
  echo "== build (Release, CUDA on) into $BUILD"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DULYSSES_CUDA=ON >"$BUILD.configure.log" 2>&1 ||
    { cat "$BUILD.configure.log"; exit 1; }
  targets=(ulysses-train ulysses-bench-attention)
  for binary in "${TEST_BINARIES[@]}"; do targets+=("$(basename "$binary")"); done
  cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}" >"$BUILD.build.log" 2>&1 ||
    { tail -50 "$BUILD.build.log"; exit 1; }
else
  echo "== prebuilt: $BUILD"
fi
for binary in apps/ulysses-train apps/ulysses-bench-attention "${TEST_BINARIES[@]}"; do
  [ -x "$BUILD/$binary" ] || { echo "gpu-check: $BUILD/$binary is not built" >&2; exit 1; }
done
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# check NAME COMMAND...: runs a GPU test binary; a failure, a skip or a timeout fails the check.
FAILED=()
check() {
  local name=$1 log="$LOGS/$1.log"
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
TORCH=0
if ((RUN_TORCH)) && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  TORCH=1
fi
python3 - "$BUILD/apps/ulysses-train" "$LOGS" "$TORCH" <<'PYTHON'
import json, os, subprocess, sys

binary, logs, torch_peer = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
LAYERS, D, HEADS, KV, FF, VOCAB = 16, 2048, 32, 8, 8192, 32000
PEAK_FLOPS = 989e12
CONFIG = os.path.join(logs, "llama1b.yaml")
with open(CONFIG, "w") as f:
    f.write("device: cuda\nmodel: {family: llama, rope_theta: 500000}\n"
            "train: {batch_size: 1, lr: 1.0e-4, warmup_steps: 0, grad_clip: 1.0}\n"
            "data: {source: synthetic}\nlog: {every: 1}\n")


def shape_overrides(seq, attention, checkpointing, steps):
    values = {"model.n_layers": LAYERS, "model.d_model": D, "model.n_heads": HEADS,
              "model.n_kv_heads": KV, "model.d_ff": FF, "model.vocab_size": VOCAB,
              "model.max_seq_len": seq, "train.seq_len": seq, "train.steps": steps,
              "kernels.attention": attention,
              "memory.activation_checkpointing": "layer" if checkpointing else "none"}
    return [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]


def flops_per_token(seq):
    # 6 per parameter in matmuls (forward and backward) + causal attention, 6·L·T·d.
    hd = D // HEADS
    params = LAYERS * (2 * D * D + 2 * D * KV * hd + 3 * D * FF + 2 * D) + 2 * VOCAB * D + D
    return 6 * params + 6 * LAYERS * seq * D


def gib(n):
    return f"{n / 2**30:.1f} GiB"


def planned_peak(seq, attention, checkpointing):
    run = subprocess.run([binary, "--config", CONFIG, "--dry-run"] +
                         shape_overrides(seq, attention, checkpointing, 1),
                         capture_output=True, text=True, timeout=120)
    for line in run.stdout.splitlines():
        if line.startswith("#   total:"):
            return line.split("step peak")[-1].strip()
    return "?"


def ulysses(seq, attention, checkpointing, steps):
    name = f"{attention}-{'layer' if checkpointing else 'plain'}-{seq}"
    metrics, log = os.path.join(logs, name + ".jsonl"), os.path.join(logs, name + ".log")
    try:
        with open(log, "w") as out:
            run = subprocess.run([binary, "--config", CONFIG, "--set", f"log.metrics_file={metrics}"]
                                 + shape_overrides(seq, attention, checkpointing, steps),
                                 stdout=out, stderr=subprocess.STDOUT, timeout=150)
        status = run.returncode
    except subprocess.TimeoutExpired:
        status = "timeout"
    text = open(log).read()
    if status != 0:
        print(f"gpu-check: {name} ended with {status}:\n" + "\n".join(text.splitlines()[-15:]),
              file=sys.stderr)
        return None
    steps_seen = [json.loads(l) for l in open(metrics) if '"tokens_per_s"' in l]
    # The last step: the first pays for cuBLASLt plans, cuDNN graphs and the memory pool.
    last = steps_seen[-1]
    # Where the time before the first step went, and what the first steps built.
    last["startup"] = [l.split("]", 1)[-1].strip() for l in text.splitlines()
                       if "startup:" in l or " built " in l]
    return last


def torch_run(seq, checkpointing):
    if not torch_peer:
        return None
    command = [sys.executable, "scripts/bench_torch_llama.py", "--layers", str(LAYERS),
               "--d-model", str(D), "--heads", str(HEADS), "--kv-heads", str(KV),
               "--d-ff", str(FF), "--vocab", str(VOCAB), "--seq", str(seq), "--steps", "3"]
    if checkpointing:
        command.append("--checkpointing")
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired:
        print(f"gpu-check: the PyTorch peer at {seq} timed out", file=sys.stderr)
        return None
    if run.returncode != 0:
        print(f"gpu-check: the PyTorch peer at {seq} failed:\n{run.stderr[-1500:]}",
              file=sys.stderr)
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


ROWS = [("cudnn", False, 3), ("native", False, 2), ("cudnn", True, 3)]
table = []
for seq in (8192, 32768):
    peers = {}
    for attention, checkpointing, steps in ROWS:
        label = attention + (" + layer ckpt" if checkpointing else "")
        result = ulysses(seq, attention, checkpointing, steps)
        if checkpointing not in peers:
            peers[checkpointing] = torch_run(seq, checkpointing)
        peer = peers[checkpointing]
        plan = planned_peak(seq, attention, checkpointing)
        if result is None:
            table.append([label, seq, "failed"] + ["-"] * 8)
            continue
        tps = result["tokens_per_s"]
        busy = result.get("device_busy")
        table.append([
            label, seq, f"{tps:,.0f}", f"{result['step_ms']:,.0f}",
            f"{100 * tps * flops_per_token(seq) / PEAK_FLOPS:.1f}%",
            f"{100 * busy:.0f}%" if busy is not None else "-",
            gib(result["mem_peak_bytes"]["total"]), plan,
            f"{peer['tokens_per_s']:,.0f}" if peer else "-",
            gib(peer["peak_bytes"]) if peer else "-",
            f"{tps / peer['tokens_per_s']:.2f}x" if peer else "-"])
        print(f"   {label} {seq}: {table[-1][2]} tokens/s", flush=True)
        for line in result["startup"]:
            print(f"      {line}", flush=True)

header = ["run", "tokens", "tok/s", "step ms", "MFU", "busy", "peak tracked", "planned",
          "torch tok/s", "torch peak", "vs torch"]
widths = [max(len(str(row[i])) for row in table + [header]) for i in range(len(header))]
print()
for row in [header] + table:
    print(" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))
PYTHON

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu-check: failed: ${FAILED[*]}" >&2
  exit 1
fi
