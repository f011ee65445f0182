#!/usr/bin/env bash
# Startup benchmark (not a test): seconds from launching ulysses-train to its "parameters" log
# line (the model built: buffers, initial weights, optimizer state, data) and to the line of
# step 1 (which also builds the kernel plans), for a 253M-parameter Llama on the cpu backend
# (2 layers, d_model 2048, d_ff 8192, vocab 32000, 32/8 heads, 512 tokens) and, where a GPU
# and the CUDA backend are there, the 1.1B shape (16 layers, same widths, 8K tokens) on cuda.
# The trainer's own "startup:" and "step 1 built" lines say where the time went.
# Usage: scripts/bench-startup.sh [--build-dir DIR] [--runs N]   (defaults: build, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
runs=3
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "bench-startup: unknown argument '$1' (--build-dir DIR, --runs N)" >&2; exit 2 ;;
  esac
done
bin=$build/apps/ulysses-train
[ -x "$bin" ] || { echo "bench-startup: $bin is missing; build it first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

shape="family: llama, d_model: 2048, n_heads: 32, n_kv_heads: 8, d_ff: 8192, vocab_size: 32000"
cat >"$work/cpu.yaml" <<EOF
device: cpu
model: {$shape, n_layers: 2}
train: {steps: 1, batch_size: 1, seq_len: 512}
data: {source: synthetic}
EOF
cat >"$work/cuda.yaml" <<EOF
device: cuda
model: {$shape, n_layers: 16, max_seq_len: 8192}
train: {steps: 1, batch_size: 1, seq_len: 8192}
data: {source: synthetic}
EOF

# Runs one job and prints: seconds to the parameters line, to step 1, and the trainer's lines
# about startup.
time_run() {
  /usr/bin/python3 - "$bin" "$1" <<'PY'
import subprocess, sys, time
start = time.monotonic()
job = subprocess.Popen([sys.argv[1], "--config", sys.argv[2], "--color", "never"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
to_params = to_step = None
notes, tail = [], []
for line in job.stdout:
    now = time.monotonic() - start
    tail = (tail + [line.rstrip()])[-5:]
    if to_params is None and " parameters; seq_len" in line:
        to_params = now
    if to_step is None and "step 1/" in line:
        to_step = now
    if "startup:" in line or "step 1 built" in line:
        notes.append(line.rstrip().split("] ", 1)[-1].removeprefix("info "))
if job.wait() != 0 or to_params is None or to_step is None:
    print("bench-startup: the run failed:\n" + "\n".join(tail), file=sys.stderr)
    sys.exit(1)
print(f"{to_params:.2f} {to_step:.2f} | " + " | ".join(notes))
PY
}

bench() {
  local name=$1 config=$2
  printf '\n%s: %d runs (seconds from launch)\n' "$name" "$runs"
  printf '| run | to "parameters" | to step 1 | the trainer says |\n| --- | --- | --- | --- |\n'
  for ((i = 1; i <= runs; i++)); do
    line=$(time_run "$config")
    read -r params step rest <<<"$line"
    printf '| %d | %s | %s | %s |\n' "$i" "$params" "$step" "${rest#| }"
  done
}

echo "bench-startup: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
bench "253M llama, cpu, 512 tokens" "$work/cpu.yaml"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  bench "1.1B llama, cuda, 8K tokens" "$work/cuda.yaml"
else
  echo "bench-startup: no GPU (nvidia-smi lists none): the 1.1B cuda runs are skipped"
fi
