#!/usr/bin/env bash
# Async Ulysses benchmark (a benchmark, not a test): parallel.overlap off and on in one
# invocation, under mpirun with 2 and 4 ranks, for the passkey shape and a wider model.
# Reports, from the trainer's per-phase timing (docs/profiling.md), the time of the
# projections and all-to-alls, the time waited for all-to-alls and the whole step, each as
# on/off ratios. Usage: scripts/bench-overlap.sh [--steps N] [--device cpu|cuda] [--ranks 2,4]
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 - "$@" <<'PYTHON'
import argparse, json, os, subprocess, sys, tempfile

parser = argparse.ArgumentParser(prog="bench-overlap.sh")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--device", default="cpu")
parser.add_argument("--ranks", default="2,4")
parser.add_argument("--binary", default="build/apps/ulysses-train")
args = parser.parse_args()
if not os.access(args.binary, os.X_OK):
    sys.exit(f"bench-overlap: {args.binary} is missing; run scripts/setup.sh first")

SHAPES = {
    "passkey (d 64, 4 heads, 256 tokens)": ["--config", "configs/passkey-sp4.yaml"],
    "wider (d 512, 8 heads, 2048 tokens)": [
        "--config", "configs/passkey-sp4.yaml", "--set", "model.d_model=512",
        "--set", "model.n_heads=8", "--set", "model.n_kv_heads=8", "--set", "model.d_ff=1024",
        "--set", "train.seq_len=2048", "--set", "train.batch_size=2"],
}
PRE_ATTENTION = ["qkv projection", "output projection", "all-to-all wait", "all-to-all copies"]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")

def measure(ranks, shape, overlap, workdir):
    metrics = os.path.join(workdir, "m.jsonl")
    command = (["mpirun", "-np", str(ranks), "--bind-to", "none", args.binary] + SHAPES[shape] +
               ["--set", f"parallel.sp={ranks}", "--set", f"parallel.overlap={overlap}",
                "--set", f"device={args.device}", "--set", f"train.steps={args.steps}",
                "--set", "train.eval_every=0", "--set", f"log.metrics_file={metrics}",
                "--set", "log.every=1000"])
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-overlap: {' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    lines = [json.loads(l) for l in open(metrics) if '"phases"' in l][2:]  # warm-up steps out
    def mean(key):
        return sum(key(l) for l in lines) / len(lines)
    phase = lambda l, name: l["phases"].get(name, {}).get("s", 0.0)
    return {"pre": mean(lambda l: sum(phase(l, n) for n in PRE_ATTENTION)),
            "wait": mean(lambda l: phase(l, "all-to-all wait")),
            "step": mean(lambda l: l["step_ms"] / 1e3)}

print(f"{'shape':<38} {'ranks':>5} {'overlap':>7} {'proj+a2a ms':>12} {'a2a wait ms':>12} "
      f"{'step ms':>9}")
with tempfile.TemporaryDirectory() as workdir:
    for shape in SHAPES:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            off = measure(ranks, shape, "false", workdir)
            on = measure(ranks, shape, "true", workdir)
            for name, r in (("off", off), ("on", on)):
                print(f"{shape:<38} {ranks:>5} {name:>7} {1e3 * r['pre']:>12.2f} "
                      f"{1e3 * r['wait']:>12.2f} {1e3 * r['step']:>9.2f}")
            ratio = lambda key: on[key] / off[key] if off[key] > 0 else float("nan")
            print(f"{shape:<38} {ranks:>5} {'on/off':>7} {ratio('pre'):>12.3f} "
                  f"{ratio('wait'):>12.3f} {ratio('step'):>9.3f}")
PYTHON
