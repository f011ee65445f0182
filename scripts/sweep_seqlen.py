#!/usr/bin/env python3
"""Sequence-length sweep for ulysses-train: how long a sequence can I train, and how fast?

Runs short trainer runs (under mpirun, world = sp ranks) over sequence lengths x sp degrees x
ZeRO stages x activation checkpointing x head chunks x tiled MLP x offloaded layer inputs, writes
one CSV row per run (a failed run is a row with its error), draws PNG plots with gnuplot (one
panel per sp, and per-category bars of each option set's longest run), and with --budget-gib
finds the longest sequence whose per-rank peak tracked memory fits the budget (doubling, then
bisection)."""
import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

CATEGORIES = ["params", "grads", "optimizer", "activations", "checkpoints", "checkpoints_host",
              "attention", "mlp", "comm", "workspace"]
COLOURS = {"params": "#4e79a7", "grads": "#a0cbe8", "optimizer": "#f28e2b", "activations": "#ffbe7d",
           "checkpoints": "#59a14f", "checkpoints_host": "#8cd17d", "attention": "#e15759",
           "mlp": "#b6992d", "comm": "#79706e", "workspace": "#b07aa1"}
# Device memory: what the budget and the total count (checkpoints_host is the host's).
DEVICE_CATEGORIES = [c for c in CATEGORIES if c != "checkpoints_host"]
FIELDS = (["seq_len", "sp", "zero_stage", "checkpointing", "tokens_per_s", "step_s", "comm_share"]
          + [f"peak_{c}_bytes" for c in CATEGORIES]
          + ["peak_total_bytes", "exit_status", "error", "head_chunks", "tiled_mlp", "offload"])


def option_label(row):
    label = f"zero{row['zero_stage']} {row['checkpointing']}"
    if int(row.get("head_chunks", 1)) > 1:
        label += f" U{row['head_chunks']}"
    if row.get("tiled_mlp", "false") != "false":
        label += f" tiles:{row['tiled_mlp']}"
    if row.get("offload", "false") == "true":
        label += " offload"
    return label


def run_one(args, seq_len, sp, combo, limit_gib, workdir):
    zero, checkpointing, head_chunks, tiled_mlp, offload = combo
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    overrides = {
        "train.seq_len": seq_len, "model.max_seq_len": seq_len, "parallel.sp": sp,
        "parallel.zero_stage": zero, "memory.activation_checkpointing": checkpointing,
        "train.steps": args.steps, "train.eval_every": 0, "train.warmup_steps": 0,
        "train.checkpoint.dir": "''", "log.metrics_file": metrics, "log.every": 1,
        "memory.limit_gib": limit_gib, "parallel.head_chunks": head_chunks,
        "memory.tiled_mlp": tiled_mlp, "memory.offload_checkpoints": offload,
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
           "head_chunks": head_chunks, "tiled_mlp": tiled_mlp, "offload": offload,
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
        row[f"peak_{category}_bytes"] = max(l["mem_peak_bytes"].get(category, 0) for l in lines)
    return row


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for row in csv.DictReader(f):
                for key in ["seq_len", "sp", "zero_stage", "exit_status"]:
                    row[key] = int(row[key])
                for key, value in list(row.items()):
                    if key.startswith("peak_") or key in ("tokens_per_s", "step_s", "comm_share"):
                        row[key] = float(value) if value else 0.0
                rows.append(row)
    return rows


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def plot(rows, out_dir, longest=None):
    """memory.png and throughput.png: one panel per sp, a line per option set (distinct colours
    and markers, log-2 sequence axis); categories.png: the per-category peak of each option
    set's longest successful run, as stacked bars, one panel per sp."""
    if not shutil.which("gnuplot"):
        print("sweep: gnuplot not found, no plots", file=sys.stderr)
        return
    good = [r for r in rows if r["exit_status"] == 0]
    sps = sorted({r["sp"] for r in good})
    if not sps:
        return
    labels = sorted({option_label(r) for r in good})
    for column, name, ylabel in [("peak_total_bytes", "memory", "peak tracked MiB per rank"),
                                 ("tokens_per_s", "throughput", "tokens/s")]:
        lines = [f"set terminal png size {480 * len(sps)},520 noenhanced",
                 f"set output '{os.path.join(out_dir, name)}.png'",
                 f"set multiplot layout 1,{len(sps)} title '{ylabel}'",
                 "set logscale x 2", "set logscale y", "set grid", "set key left top font ',8'",
                 "set xlabel 'sequence length'"]
        for sp in sps:
            plots = []
            for index, label in enumerate(labels):
                points = sorted((r for r in good if r["sp"] == sp and option_label(r) == label),
                                key=lambda r: r["seq_len"])
                if not points:
                    continue
                values = "\n".join(
                    f"{p['seq_len']} {p[column] / 2**20 if column == 'peak_total_bytes' else p[column]}"
                    for p in points)
                plots.append((f"'-' using 1:2 with linespoints lc {index + 1} pt {index + 1} "
                              f"title '{label}'", values))
            lines.append(f"set title 'sp {sp}'")
            if plots:
                lines.append("plot " + ", ".join(p[0] for p in plots))
                for _, values in plots:
                    lines += [values, "e"]
        lines.append("unset multiplot")
        gnuplot("\n".join(lines) + "\n")

    # Per-category bars of the longest run of each option set.
    chosen = {}
    for r in good:
        key = (r["sp"], option_label(r))
        if key not in chosen or r["seq_len"] > chosen[key]["seq_len"]:
            chosen[key] = r
    shown = [c for c in DEVICE_CATEGORIES + ["checkpoints_host"]
             if any(r.get(f"peak_{c}_bytes", 0) for r in chosen.values())]
    lines = [f"set terminal png size {520 * len(sps)},560 noenhanced",
             f"set output '{os.path.join(out_dir, 'categories')}.png'",
             f"set multiplot layout 1,{len(sps)} title 'peak tracked MiB per rank by category, "
             "longest run of each option set (N = its length)'",
             "set style data histograms", "set style histogram rowstacked",
             "set style fill solid 0.9 border -1", "set boxwidth 0.7", "set grid y",
             "set key outside bottom center horizontal font ',8'", "set xtics rotate by -35 font ',8'"]
    for sp in sps:
        runs = [chosen[k] for k in sorted(chosen) if k[0] == sp]
        lines.append(f"set title 'sp {sp}'")
        parts = []
        for i, category in enumerate(shown):
            xtic = ":xtic(1)" if i == 0 else ""
            parts.append(f"'-' using 2{xtic} lc rgb '{COLOURS[category]}' title '{category}'")
        lines.append("plot " + ", ".join(parts))
        for category in shown:
            for r in runs:
                label = f"{option_label(r)} N={r['seq_len']}".replace(" ", "\\n", 1)
                lines.append(f"\"{label}\" {r.get(f'peak_{category}_bytes', 0) / 2**20}")
            lines.append("e")
    lines.append("unset multiplot")
    gnuplot("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/passkey-tiny.yaml")
    parser.add_argument("--binary", default="build/apps/ulysses-train")
    parser.add_argument("--seq-lens", default="256,512,1024,2048")
    parser.add_argument("--sp", default="1,2,4")
    parser.add_argument("--zero", default="0,1")
    parser.add_argument("--checkpointing", default="none,layer")
    parser.add_argument("--head-chunks", default="1",
                        help="parallel.head_chunks values (UPipe), e.g. 1,4")
    parser.add_argument("--tiled-mlp", default="false", help="memory.tiled_mlp values, e.g. false,auto")
    parser.add_argument("--offload", default="false",
                        help="memory.offload_checkpoints values (with layer checkpointing only)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=0.0,
                        help="find the longest sequence whose per-rank peak fits this budget")
    parser.add_argument("--max-seq-len", type=int, default=1 << 22)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per run")
    parser.add_argument("--set", action="append", help="extra trainer override key=value")
    parser.add_argument("--out", default="sweep")
    parser.add_argument("--from-csv", action="extend", nargs="+",
                        help="draw the plots of earlier sweeps' sweep.csv files (one or more, "
                             "repeatable) into --out instead of running")
    args = parser.parse_args()
    if args.from_csv:
        os.makedirs(args.out, exist_ok=True)
        plot(read_rows(args.from_csv), args.out)
        print(f"sweep: plots of {len(args.from_csv)} sweep(s) in {args.out}")
        return
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"sweep: {args.binary} is missing; run scripts/setup.sh first")
    os.makedirs(args.out, exist_ok=True)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    options = [(int(zero), ck, int(u), tiles, offload)
               for zero in args.zero.split(",") for ck in args.checkpointing.split(",")
               for u in args.head_chunks.split(",") for tiles in args.tiled_mlp.split(",")
               for offload in args.offload.split(",")
               if offload == "false" or ck == "layer"]  # offloading needs checkpoints
    combos = [(int(sp), option) for sp in args.sp.split(",") for option in options]
    rows = []
    with tempfile.TemporaryDirectory() as workdir, \
            open(os.path.join(args.out, "sweep.csv"), "w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=FIELDS)
        writer.writeheader()

        def record(row):
            rows.append(row)
            writer.writerow(row)
            csv_file.flush()
            print(f"seq {row['seq_len']:>8} sp {row['sp']} {option_label(row):<30} -> " +
                  (f"{row['tokens_per_s']} tok/s, peak {row['peak_total_bytes'] / 2**20:.1f} MiB"
                   if row["exit_status"] == 0 else f"FAILED ({row['error']})"), flush=True)
            return row["exit_status"] == 0

        if args.budget_gib <= 0:
            for sp, option in combos:
                for seq_len in seq_lens:
                    record(run_one(args, seq_len, sp, option, 0, workdir))
        else:
            longest = {}
            for sp, option in combos:
                step = 64 * sp
                good, bad = 0, None
                best_row = None
                seq_len = max(seq_lens[0] // step * step, step)
                while seq_len <= args.max_seq_len:  # doubling
                    row = run_one(args, seq_len, sp, option, args.budget_gib, workdir)
                    if record(row):
                        good, best_row, seq_len = seq_len, row, seq_len * 2
                    else:
                        bad = seq_len
                        break
                while bad is not None and bad - good > step:  # bisection
                    middle = (good + bad) // 2 // step * step
                    row = run_one(args, middle, sp, option, args.budget_gib, workdir)
                    if record(row):
                        good, best_row = middle, row
                    else:
                        bad = middle
                longest[(sp, option)] = (good, best_row)
            with open(os.path.join(args.out, "longest.csv"), "w") as f:
                f.write("sp,zero_stage,checkpointing,head_chunks,tiled_mlp,offload,budget_gib,"
                        "tokens_per_s,longest_seq_len\n")
                for (sp, (zero, ck, u, tiles, offload)), (good, row) in longest.items():
                    speed = row["tokens_per_s"] if row else ""
                    f.write(f"{sp},{zero},{ck},{u},{tiles},{offload},{args.budget_gib},{speed},"
                            f"{good}\n")
                    print(f"longest sequence within {args.budget_gib} GiB per rank: sp {sp} "
                          f"zero {zero} {ck} U{u} tiles:{tiles} offload:{offload}: "
                          f"{good or 'none fits'}" + (f" at {speed} tok/s" if row else ""))
    plot(rows, args.out)
    print(f"sweep: wrote {args.out}/sweep.csv" +
          (f" and {args.out}/longest.csv" if args.budget_gib > 0 else ""))


if __name__ == "__main__":
    main()
