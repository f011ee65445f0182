#!/usr/bin/env bash
# What timing phases on the device costs (a benchmark, not a test; docs/profiling.md, "What the
# events cost"): the same cuda run with log.device_timing on and off, alternated, in one
# invocation. Prints each one's mean step time (the first two steps left out: cuBLASLt plans and
# the memory pool), the difference, and the per-step read-back of the events, which happens
# after the step's synchronisation and is not in the step time. The default is the 1.1 B Llama
# shape (16 layers, d 2048, 32/8 heads, d_ff 8192, vocab 32000) at 8192 tokens with cuDNN
# attention. Usage: scripts/bench-device-timing.sh [--binary B] [--steps N] [--repeats R]
#   [--seq-len T] [--attention cudnn|native] [--layers L]
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 - "$@" <<'PYTHON'
import argparse, json, os, statistics, subprocess, sys, tempfile

parser = argparse.ArgumentParser(prog="bench-device-timing.sh")
parser.add_argument("--binary", default="build/apps/ulysses-train")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--repeats", type=int, default=1, help="runs of each setting, alternated")
parser.add_argument("--seq-len", type=int, default=8192)
parser.add_argument("--attention", default="cudnn")
parser.add_argument("--layers", type=int, default=16)
args = parser.parse_args()
if not os.access(args.binary, os.X_OK):
    sys.exit(f"bench-device-timing: {args.binary} is missing; build ulysses-train first")

CONFIG = """device: cuda
model: {family: llama, d_model: 2048, n_heads: 32, n_kv_heads: 8, d_ff: 8192,
        vocab_size: 32000, rope_theta: 500000}
train: {batch_size: 1, lr: 1.0e-4, warmup_steps: 0, grad_clip: 1.0, eval_every: 0}
data: {source: synthetic}
log: {every: 1000}
"""

def run(timing, workdir):
    config, metrics = os.path.join(workdir, "bench.yaml"), os.path.join(workdir, "m.jsonl")
    with open(config, "w") as f:
        f.write(CONFIG)
    if os.path.exists(metrics):
        os.remove(metrics)
    command = [args.binary, "--config", config,
               "--set", f"model.n_layers={args.layers}",
               "--set", f"train.seq_len={args.seq_len}", "--set", f"model.max_seq_len={args.seq_len}",
               "--set", f"train.steps={args.steps}", "--set", f"kernels.attention={args.attention}",
               "--set", f"log.device_timing={timing}", "--set", f"log.metrics_file={metrics}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-device-timing: {' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    lines = [json.loads(l) for l in open(metrics) if '"phases"' in l][2:]
    if not lines:
        sys.exit("bench-device-timing: fewer than 3 steps; raise --steps")
    return lines

results = {"true": [], "false": []}
with tempfile.TemporaryDirectory() as workdir:
    for _ in range(args.repeats):
        for timing in ("true", "false"):
            results[timing] += run(timing, workdir)

def mean(lines, key):
    return statistics.mean(key(l) for l in lines)

on, off = results["true"], results["false"]
step_on, step_off = mean(on, lambda l: l["step_ms"]), mean(off, lambda l: l["step_ms"])
readback = mean(on, lambda l: l.get("device_readback_ms", 0.0))
print(f"shape: llama {args.layers} layers, d 2048, {args.seq_len} tokens, "
      f"kernels.attention {args.attention}; {len(on)} steps of each setting")
print(f"device timing on : step {step_on:9.2f} ms, read-back {readback:.2f} ms per step, "
      f"device busy {100 * mean(on, lambda l: l.get('device_busy', 0.0)):.0f}%, "
      f"{mean(on, lambda l: l.get('launches', 0)):.0f} launches per step")
print(f"device timing off: step {step_off:9.2f} ms")
print(f"cost: {step_on - step_off:+.2f} ms in the step ({100 * (step_on - step_off) / step_off:+.2f}%), "
      f"{step_on + readback - step_off:+.2f} ms with the read-back "
      f"({100 * (step_on + readback - step_off) / step_off:+.2f}% of the step)")
PYTHON
