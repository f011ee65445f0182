#!/usr/bin/env bash
# CPU throughput benchmark (not a test): tokens/s and model FLOP/s as a fraction of this
# machine's measured sgemm rate, for GPT-2 124M at T=1024 and a Llama config at T=4096, then
# PyTorch's tokens/s on the same GPT-2 runs (scripts/bench_torch_gpt2.py) and the ratio.
# Usage: scripts/bench-cpu.sh [steps]   (build first: scripts/setup.sh --all)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-3}
bin=build/apps/ulysses-train
[ -x "$bin" ] || { echo "bench-cpu: $bin is missing; run scripts/setup.sh --all first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gemm_line=$(build/apps/ulysses-bench-gemm 2048 5)
gemm_gflops=$(echo "$gemm_line" | awk '{print $3}')
echo "$gemm_line"

# name | config | overrides
runs=(
  "gpt2-124m B=1 T=1024|configs/gpt2-124m.yaml|--set train.batch_size=1 --set train.seq_len=1024"
  "gpt2-124m B=4 T=1024|configs/gpt2-124m.yaml|--set train.batch_size=4 --set train.seq_len=1024"
  "llama-24m T=4096|configs/llama-tiny.yaml|--set model.n_layers=8 --set model.d_model=512 --set model.n_heads=8 --set model.n_kv_heads=4 --set model.d_ff=1408 --set train.batch_size=1 --set train.seq_len=4096 --set model.max_seq_len=4096 --set data.val_fraction=0.05"
)
declare -A ulysses_speed
printf '\n| run | params | tokens/step | step s | tokens/s | model GFLOP/s | of sgemm | peak tracked |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- |\n'
for entry in "${runs[@]}"; do
  IFS='|' read -r name config overrides <<<"$entry"
  metrics="$work/metrics.jsonl"
  # shellcheck disable=SC2086
  "$bin" --config "$config" $overrides --set train.steps="$steps" --set train.eval_every=0 \
    --set train.warmup_steps=0 --set log.metrics_file="$metrics" --set train.checkpoint.dir="" \
    >"$work/log.txt" 2>&1 || { echo "bench-cpu: $name failed:"; tail -5 "$work/log.txt"; exit 1; }
  # shellcheck disable=SC2086
  plan=$("$bin" --config "$config" $overrides --dry-run)
  params=$(echo "$plan" | sed -n 's/^# model: [a-z0-9]*, \([0-9]*\) parameters.*/\1/p')
  layers=$(echo "$plan" | awk '/^  n_layers:/{print $2; exit}')
  width=$(echo "$plan" | awk '/^  d_model:/{print $2; exit}')
  seq=$(echo "$plan" | awk '/^  seq_len:/{print $2; exit}')
  # Steps after the first (warm-up); 6·N per token plus causal attention 6·L·C·T per token.
  row=$(/usr/bin/python3 - "$metrics" "$params" "$layers" "$width" "$seq" "$gemm_gflops" "$name" <<'PY'
import json, sys
path, params, layers, width, seq, gemm, name = sys.argv[1:]
params, layers, width, seq, gemm = int(params), int(layers), int(width), int(seq), float(gemm)
lines = [json.loads(l) for l in open(path) if '"loss"' in l]
timed = lines[1:] if len(lines) > 1 else lines
seconds = sum(l["step_ms"] for l in timed) / 1e3 / len(timed)
tokens = timed[0]["tokens"]
flops_per_token = 6 * params + 6 * layers * width * seq
gflops = flops_per_token * tokens / seconds / 1e9
peak = max(l["mem_peak_bytes"]["total"] for l in lines) / 2**20
print(f"| {name} | {params/1e6:.1f}M | {tokens} | {seconds:.2f} | {tokens/seconds:.0f} | "
      f"{gflops:.1f} | {100*gflops/gemm:.0f}% | {peak:.0f} MiB |")
PY
)
  echo "$row"
  ulysses_speed["$name"]=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $6); print $6}')
done

# PyTorch on the same runs of GPT-2, in this invocation, so the comparison is a ratio of two
# measurements on the same machine state (skipped when torch is missing).
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  printf '\n| run | PyTorch tokens/s | PyTorch peak RSS | ulysses tokens/s | ulysses / PyTorch |\n'
  printf '| --- | --- | --- | --- | --- |\n'
  for batch in 1 4; do
    name="gpt2-124m B=$batch T=1024"
    line=$(/usr/bin/python3 scripts/bench_torch_gpt2.py --batch "$batch" --seq 1024 \
      --steps "$((steps < 2 ? 2 : steps))" --threads "$(nproc)")
    torch_speed=$(echo "$line" | sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p')
    torch_rss=$(echo "$line" | sed -n 's/.*peak RSS \([0-9.]* GiB\).*/\1/p')
    awk -v n="$name" -v t="$torch_speed" -v r="$torch_rss" -v u="${ulysses_speed[$name]}" \
      'BEGIN {printf "| %s | %s | %s | %s | %.2f |\n", n, t, r, u, u / t}'
  done
else
  echo "bench-cpu: python3-torch is missing; no PyTorch baseline"
fi
