#!/usr/bin/env python3
"""Sequence-length sweep for ulysses-train: how long a sequence can I train, and how fast?

Runs short trainer runs (under mpirun, world = sp ranks) over sequence lengths x sp degrees x
ZeRO stages x activation checkpointing, writes one CSV row per run (a failed run is a row with
its error), draws PNG plots with gnuplot, and with --budget-gib finds the longest sequence whose
per-rank peak tracked memory fits the budget (doubling, then bisection)."""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

CATEGORIES = ["params", "grads", "optimizer", "activations", "checkpoints", "attention", "comm",
              "workspace"]
FIELDS = (["seq_len", "sp", "zero_stage", "checkpointing", "tokens_per_s", "step_s", "comm_share"]
          + [f"peak_{c}_bytes" for c in CATEGORIES] + ["peak_total_bytes", "exit_status", "error"])


def run_one(args, seq_len, sp, zero, checkpointing, limit_gib, workdir):
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    overrides = {
        "train.seq_len": seq_len, "model.max_seq_len": seq_len, "parallel.sp": sp,
        "parallel.zero_stage": zero, "memory.activation_checkpointing": checkpointing,
        "train.steps": args.steps, "train.eval_every": 0, "train.warmup_steps": 0,
        "train.checkpoint.dir": "''", "log.metrics_file": metrics, "log.every": 1,
        "memory.limit_gib": limit_gib,
    }
    command = ["mpirun", "-np", str(sp), "--bind-to", "none", args.binary, "--config", args.config]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    for extra in args.set or []:
        command += ["--set", extra]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        status, output = done.returncode, done.stdout + done.stderr
        output = re.sub(r"\x1b\[[0-9;]*m", "", output)
    except subprocess.TimeoutExpired:
        status, output = 124, f"timed out after {args.timeout} s"
    row = {"seq_len": seq_len, "sp": sp, "zero_stage": zero, "checkpointing": checkpointing,
           "exit_status": status, "error": ""}
    lines = []
    if os.path.exists(metrics):
        lines = [json.loads(l) for l in open(metrics) if '"loss"' in l]
    if status != 0 or not lines:
        # The trainer's own message ("[time] [rank r] error <message>"), else the last line.
        messages = [l.split(" error ", 1)[1] for l in output.splitlines() if " error " in l]
        lines_out = output.strip().splitlines()
        row["error"] = (messages[0] if messages else (lines_out[-1] if lines_out else "?"))[:300]
        return row
    timed = lines[1:] if len(lines) > 1 else lines
    step_s = sum(l["step_ms"] for l in timed) / 1e3 / len(timed)
    comm_s = sum(l["all_to_all_s"] + l["grad_comm_s"] for l in timed) / len(timed)
    row.update(tokens_per_s=round(timed[0]["tokens"] / step_s, 1), step_s=round(step_s, 4),
               comm_share=round(comm_s / step_s, 3))
    for category in CATEGORIES + ["total"]:
        row[f"peak_{category}_bytes"] = max(l["mem_peak_bytes"][category] for l in lines)
    return row


def plot(rows, out_dir):
    if not shutil.which("gnuplot"):
        print("sweep: gnuplot not found, no plots", file=sys.stderr)
        return
    series = {}
    for row in rows:
        if row["exit_status"] == 0:
            key = f"sp{row['sp']} zero{row['zero_stage']} {row['checkpointing']}"
            series.setdefault(key, []).append(row)
    for column, name, label in [("peak_total_bytes", "memory", "peak tracked MiB per rank"),
                                ("tokens_per_s", "throughput", "tokens/s")]:
        data_files, plots = [], []
        for index, (key, points) in enumerate(sorted(series.items())):
            path = os.path.join(out_dir, f".{name}-{index}.dat")
            with open(path, "w") as f:
                for p in sorted(points, key=lambda p: p["seq_len"]):
                    value = p[column] / 2**20 if column == "peak_total_bytes" else p[column]
                    f.write(f"{p['seq_len']} {value}\n")
            data_files.append(path)
            plots.append(f"'{path}' using 1:2 with linespoints title '{key}'")
        if not plots:
            continue
        script = (f"set terminal png size 900,600; set output '{os.path.join(out_dir, name)}.png';"
                  f"set logscale x 2; set xlabel 'sequence length'; set ylabel '{label}';"
                  f"set key left top; set grid; plot {', '.join(plots)}")
        subprocess.run(["gnuplot", "-e", script], check=True)
        for path in data_files:
            os.remove(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/passkey-tiny.yaml")
    parser.add_argument("--binary", default="build/apps/ulysses-train")
    parser.add_argument("--seq-lens", default="256,512,1024,2048")
    parser.add_argument("--sp", default="1,2,4")
    parser.add_argument("--zero", default="0,1")
    parser.add_argument("--checkpointing", default="none,layer")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=0.0,
                        help="find the longest sequence whose per-rank peak fits this budget")
    parser.add_argument("--max-seq-len", type=int, default=1 << 22)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run")
    parser.add_argument("--set", action="append", help="extra trainer override key=value")
    parser.add_argument("--out", default="sweep")
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"sweep: {args.binary} is missing; run scripts/setup.sh first")
    os.makedirs(args.out, exist_ok=True)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    combos = [(int(sp), int(zero), ck) for sp in args.sp.split(",") for zero in args.zero.split(",")
              for ck in args.checkpointing.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as workdir, \
            open(os.path.join(args.out, "sweep.csv"), "w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=FIELDS)
        writer.writeheader()

        def record(row):
            rows.append(row)
            writer.writerow(row)
            csv_file.flush()
            print(f"seq {row['seq_len']:>8} sp {row['sp']} zero {row['zero_stage']} "
                  f"{row['checkpointing']:<5} -> " +
                  (f"{row['tokens_per_s']} tok/s, peak {row['peak_total_bytes'] / 2**20:.1f} MiB"
                   if row["exit_status"] == 0 else f"FAILED ({row['error']})"), flush=True)
            return row["exit_status"] == 0

        if args.budget_gib <= 0:
            for sp, zero, ck in combos:
                for seq_len in seq_lens:
                    record(run_one(args, seq_len, sp, zero, ck, 0, workdir))
        else:
            longest = {}
            for sp, zero, ck in combos:
                step = 64 * sp
                good, bad = 0, None
                seq_len = max(seq_lens[0] // step * step, step)
                while seq_len <= args.max_seq_len:  # doubling
                    if record(run_one(args, seq_len, sp, zero, ck, args.budget_gib, workdir)):
                        good, seq_len = seq_len, seq_len * 2
                    else:
                        bad = seq_len
                        break
                while bad is not None and bad - good > step:  # bisection
                    middle = (good + bad) // 2 // step * step
                    if record(run_one(args, middle, sp, zero, ck, args.budget_gib, workdir)):
                        good = middle
                    else:
                        bad = middle
                longest[(sp, zero, ck)] = good
            with open(os.path.join(args.out, "longest.csv"), "w") as f:
                f.write("sp,zero_stage,checkpointing,budget_gib,longest_seq_len\n")
                for (sp, zero, ck), good in longest.items():
                    f.write(f"{sp},{zero},{ck},{args.budget_gib},{good}\n")
                    print(f"longest sequence within {args.budget_gib} GiB per rank: sp {sp} "
                          f"zero {zero} {ck}: {good or 'none fits'}")
    plot(rows, args.out)
    print(f"sweep: wrote {args.out}/sweep.csv" +
          (f" and {args.out}/longest.csv" if args.budget_gib > 0 else ""))


if __name__ == "__main__":
    main()
