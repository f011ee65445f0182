"""Plots of scripts/sweep_seqlen.py's rows (docs/sweep.md): memory.png and throughput.png, one
panel per sp and a line per option set, and categories.png, the peak by category of each option
set's longest run. Also the CSV reader --from-csv uses."""
import csv
import os
import shutil
import subprocess
import sys

CATEGORIES = ["params", "grads", "optimizer", "activations", "checkpoints", "checkpoints_host",
              "attention", "mlp", "comm", "workspace"]
COLOURS = {"params": "#4e79a7", "grads": "#a0cbe8", "optimizer": "#f28e2b", "activations": "#ffbe7d",
           "checkpoints": "#59a14f", "checkpoints_host": "#8cd17d", "attention": "#e15759",
           "mlp": "#b6992d", "comm": "#79706e", "workspace": "#b07aa1"}
# Device memory: what the budget and the total count (checkpoints_host is the host's).
DEVICE_CATEGORIES = [c for c in CATEGORIES if c != "checkpoints_host"]
FIELDS = (["seq_len", "sp", "zero_stage", "checkpointing", "tokens_per_s", "step_s", "comm_share"]
          + [f"peak_{c}_bytes" for c in CATEGORIES]
          + ["peak_total_bytes", "exit_status", "error", "head_chunks", "tiled_mlp", "offload",
             "ring"])


def option_label(row):
    label = f"zero{row['zero_stage']} {row['checkpointing']}"
    if int(row.get("ring", 1)) > 1:
        label += f" ring{row['ring']}"
    if int(row.get("head_chunks", 1)) > 1:
        label += f" U{row['head_chunks']}"
    if row.get("tiled_mlp", "false") != "false":
        label += f" tiles:{row['tiled_mlp']}"
    if row.get("offload", "false") == "true":
        label += " offload"
    return label


def typed_row(row):
    """A row as csv reads it (every field a string) with its numbers as numbers."""
    row["ring"] = row.get("ring") or 1  # rows of sweeps from before --ring
    for key in ["seq_len", "sp", "zero_stage", "exit_status", "ring"]:
        row[key] = int(row[key])
    for key, value in list(row.items()):
        if key.startswith("peak_") or key in ("tokens_per_s", "step_s", "comm_share"):
            row[key] = float(value) if value else 0.0
    return row


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [typed_row(row) for row in csv.DictReader(f)]
    return rows


def gnuplot(script):
    """Runs gnuplot on script; its warnings (a series of one point has an empty range) are
    printed only when it fails."""
    done = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        done.check_returncode()


def plot(rows, out_dir):
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
