#!/usr/bin/env bash
# GPU check for one machine with one GPU, in under 5 minutes on an H200:
#   1. builds the CUDA backend (Release) and runs the op table's GPU column first
#      (tests/test_backend_ops.cpp), then the GPU tests (a skip counts as a failure),
#      including two ranks sharing the GPU through MPI staged via the host (sp = 2);
#   2. benchmarks a Llama-1B-shaped model at 8K and 32K tokens, with the native and the cuDNN
#      attention: tokens/s, model FLOP/s as a fraction of the H200's 989 TFLOP/s bf16 peak,
#      peak tracked memory;
#   3. finds the longest sequence an 8B-shaped model trains at on this GPU (doubling, then
#      bisection; a run that fails with out-of-memory is a data point, not an error);
#   4. prints a summary table.
# Usage: scripts/gpu-check.sh [build-dir]   (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
PEAK_FLOPS=989e12
DEADLINE_S=285  # the 8B search stops here, whatever it has found
START_S=$SECONDS

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no GPU: nvidia-smi is missing or lists no device; this check needs one" >&2
  exit 1
fi
nvidia-smi -L | head -1

echo "== build (Release, CUDA on) into $BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DULYSSES_CUDA=ON >"$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target test_backend_ops test_cuda_ops test_cuda_training test_cuda_profiling staged_comm_test staged_training_test ulysses-train \
  >"$BUILD.build.log" 2>&1 || { tail -50 "$BUILD.build.log"; exit 1; }

echo "== GPU tests"
# First the op table's GPU column (tests/test_backend_ops.cpp): every op against its double
# reference on the device, as the other two columns are checked on every machine.
"$BUILD/tests/test_backend_ops" --gtest_filter='*/cuda_on_gpu' --gtest_brief=1 2>&1 |
  tee "$BUILD/test_backend_ops.log"
if grep -q "SKIPPED\|FAILED" "$BUILD/test_backend_ops.log"; then
  echo "gpu-check: test_backend_ops (cuda_on_gpu) failed or skipped on a machine with a GPU" >&2
  exit 1
fi
for test in test_cuda_ops test_cuda_training test_cuda_profiling; do
  "$BUILD/tests/$test" --gtest_brief=1 2>&1 | tee "$BUILD/$test.log"
  if grep -q "SKIPPED" "$BUILD/$test.log"; then
    echo "gpu-check: $test skipped tests on a machine with a GPU" >&2
    exit 1
  fi
done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for test in staged_comm_test staged_training_test; do
  mpirun -np 2 "$BUILD/tests/mpi/$test" --gtest_brief=1 2>&1 | tee "$BUILD/$test.log"
  if grep -q "SKIPPED\|FAILED" "$BUILD/$test.log"; then
    echo "gpu-check: $test (2 ranks on one GPU) failed or skipped" >&2
    exit 1
  fi
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/bench.yaml" <<'EOF'
device: cuda
model: {family: llama, rope_theta: 500000}
train: {steps: 3, batch_size: 1, lr: 1.0e-4, warmup_steps: 0, grad_clip: 1.0}
data: {source: synthetic}
log: {every: 1}
EOF

# run NAME LAYERS D HEADS KV FF VOCAB SEQ STEPS -> prints "ok|oom|fail tokens/s step_ms peak_bytes"
run() {
  local name=$1 layers=$2 d=$3 heads=$4 kv=$5 ff=$6 vocab=$7 seq=$8 steps=$9
  local metrics="$WORK/$name-$seq.jsonl" log="$WORK/$name-$seq.log"
  if timeout 90 "$BUILD/apps/ulysses-train" --config "$WORK/bench.yaml" \
      --set model.n_layers="$layers" --set model.d_model="$d" --set model.n_heads="$heads" \
      --set model.n_kv_heads="$kv" --set model.d_ff="$ff" --set model.vocab_size="$vocab" \
      --set train.seq_len="$seq" --set model.max_seq_len="$seq" --set train.steps="$steps" \
      --set memory.activation_checkpointing="${CHECKPOINTING:-none}" \
      --set kernels.attention="${ATTENTION:-native}" \
      --set log.metrics_file="$metrics" >"$log" 2>&1; then
    # The last step: the first pays for cuBLASLt plans and the memory pool.
    python3 - "$metrics" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
last = lines[-1]
print("ok", last["tokens_per_s"], last["step_ms"], last["mem_peak_bytes"]["total"])
EOF
  elif grep -qiE "out of memory|device allocation of .* failed" "$log"; then
    echo "oom 0 0 0"
  else
    echo "gpu-check: $name at $seq tokens failed (not out of memory):" >&2
    tail -20 "$log" >&2
    echo "fail 0 0 0"
  fi
}

# Model FLOPs per token: 6·params (matmuls, forward + backward) + causal attention
# 6·layers·seq·d (half of 12·layers·seq·d).
flops_per_token() {
  python3 -c "
L,d,h,kv,ff,V,T=$1,$2,$3,$4,$5,$6,$7
hd=d//h
params=L*(d*d*2+2*d*kv*hd+3*d*ff+2*d)+2*V*d+d
print(6*params+6*L*T*d)"
}

declare -a ROWS
echo "== Llama-1B shape (16 layers, d 2048, 32 heads, 8 kv heads, d_ff 8192, vocab 32000)"
for attention in native cudnn; do
  for seq in 8192 32768; do
    read -r status tps step_ms peak < <(ATTENTION=$attention run llama1b 16 2048 32 8 8192 32000 "$seq" 2)
    if [[ $status == ok ]]; then
      fpt=$(flops_per_token 16 2048 32 8 8192 32000 "$seq")
      mfu=$(python3 -c "print(f'{$tps*$fpt/$PEAK_FLOPS*100:.1f}%')")
      ROWS+=("llama-1B $attention|$seq|$(printf '%.0f' "$tps")|$(printf '%.0f' "$step_ms")|$mfu|$(python3 -c "print(f'{$peak/2**30:.1f} GiB')")")
    else
      ROWS+=("llama-1B $attention|$seq|$status|-|-|-")
    fi
  done
done

echo "== longest sequence for the 8B shape (32 layers, d 4096, 32 heads, 8 kv, d_ff 14336, vocab 128256; layer checkpointing)"
fits() {  # fits SEQ -> 0 when one training step runs
  local status
  read -r status _ < <(CHECKPOINTING=layer run llama8b 32 4096 32 8 14336 128256 "$1" 1)
  echo "   8B at $1 tokens: $status" >&2
  [[ $status == ok ]]
}
best=0
low=0
high=0
seq=4096
while ((SECONDS - START_S < DEADLINE_S)); do
  if fits "$seq"; then low=$seq; seq=$((seq * 2)); else high=$seq; break; fi
done
while ((high > 0 && low > 0 && high - low > 4096 && SECONDS - START_S < DEADLINE_S)); do
  mid=$(((low + high) / 2 / 4096 * 4096))
  if fits "$mid"; then low=$mid; else high=$mid; fi
done
best=$low
if ((best == 0)); then
  ROWS+=("llama-8B|none fits (from 4096)|-|-|-|-")
else
  ROWS+=("llama-8B|longest $best|-|-|-|-")
fi

echo
echo "== parallel.overlap off and on, 2 ranks sharing the GPU (scripts/bench-overlap.sh)"
if ((SECONDS - START_S < DEADLINE_S)); then
  scripts/bench-overlap.sh --device cuda --ranks 2 --steps 6 --binary "$BUILD/apps/ulysses-train" ||
    echo "gpu-check: bench-overlap failed" >&2
fi

echo
echo "== summary ($((SECONDS - START_S)) s)"
printf '%-16s | %-22s | %-10s | %-9s | %-10s | %-12s\n' model tokens tokens/s step_ms "MFU(989T)" "peak tracked"
for row in "${ROWS[@]}"; do
  IFS='|' read -r a b c d e f <<<"$row"
  printf '%-16s | %-22s | %-10s | %-9s | %-10s | %-12s\n' "$a" "$b" "$c" "$d" "$e" "$f"
done
