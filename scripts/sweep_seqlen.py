#!/usr/bin/env python3
"""Sequence-length sweep for ulysses-train: how long a sequence can I train, and how fast?

Runs short trainer runs (under mpirun, world = sp ranks) over sequence lengths x sp degrees x
ZeRO stages x activation checkpointing x head chunks x tiled MLP x offloaded layer inputs x ring
degrees, writes one CSV row per run (a failed run is a row with its error), draws PNG plots with
gnuplot (one panel per sp, and per-category bars of each option set's longest run), and with
--budget-gib finds the longest sequence whose per-rank peak tracked memory fits the budget
(doubling, then bisection). Started again into the same --out, a sweep continues where it stopped."""
import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from sweep_plots import CATEGORIES, option_label, plot, read_rows
from sweep_table import TIMED_OUT, SweepRefused, SweepTable, file_sha256, row_key

# The defaults of --config and --binary are this repository's; paths given are the caller's.
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The trainer keys each run sets, and the sweep option that chooses them: a --set of one would
# make the rows say one thing and measure another.
SWEEP_KEYS = {"train.seq_len": "--seq-lens", "model.max_seq_len": "--seq-lens",
              "parallel.sp": "--sp", "parallel.zero_stage": "--zero",
              "memory.activation_checkpointing": "--checkpointing",
              "parallel.head_chunks": "--head-chunks", "memory.tiled_mlp": "--tiled-mlp",
              "memory.offload_checkpoints": "--offload", "parallel.ring": "--ring",
              "train.steps": "--steps",
              "memory.limit_gib": "--budget-gib", "train.eval_every": None,
              "train.warmup_steps": None, "train.checkpoint.dir": None, "log.metrics_file": None,
              "log.every": None}


class Stopped(Exception):
    """The sweep got SIGTERM or SIGHUP."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum, frame):
    raise Stopped(signum)


def end_job(job):
    """Ends a running mpirun: SIGTERM, which it passes to its ranks, then SIGKILL."""
    job.terminate()
    try:
        job.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()


def run_one(args, seq_len, sp, combo, limit_gib, workdir):
    zero, checkpointing, head_chunks, tiled_mlp, offload, ring = combo
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
        "parallel.ring": ring,
    }
    # check_overrides refuses a --set of these keys: the two lists are one.
    assert set(overrides) == set(SWEEP_KEYS), set(overrides) ^ set(SWEEP_KEYS)
    command = ["mpirun", "-np", str(sp), "--bind-to", "none", args.binary, "--config", args.config]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    for extra in args.set or []:
        command += ["--set", extra]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        output, _ = job.communicate(timeout=args.timeout)
        status, output = job.returncode, re.sub(r"\x1b\[[0-9;]*m", "", output)
    except subprocess.TimeoutExpired:
        end_job(job)
        status, output = TIMED_OUT, f"timed out after {args.timeout} s"
    except BaseException:  # a signal to the sweep ends its run too, which is then not a row
        end_job(job)
        raise
    row = {"seq_len": seq_len, "sp": sp, "zero_stage": zero, "checkpointing": checkpointing,
           "head_chunks": head_chunks, "tiled_mlp": tiled_mlp, "offload": offload, "ring": ring,
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


def fits(row):
    return row["exit_status"] == 0 and not row["error"]


def over_budget(row):
    """A run that failed on memory.limit_gib (an allocation past it, or a curriculum stage
    planned past it), as opposed to one that failed for another reason."""
    return row["exit_status"] != 0 and "memory.limit_gib" in row["error"]


def failure(row):
    return f"failed at {row['seq_len']} tokens (exit {row['exit_status']}): {row['error']}"


def longest_within_budget(measure, sp, option, args):
    """Doubles the length from the first of --seq-lens until a run goes over the budget, then
    bisects in steps of 64·sp tokens. Returns (longest length that fit, its row, what ended the
    search: 'budget', 'max_seq_len', or the failure of a run that failed for another reason,
    which no other length would answer)."""
    step = 64 * sp
    good, bad, best_row = 0, None, None
    seq_len = max(args.seq_lens[0] // step * step, step)
    while seq_len <= args.max_seq_len:
        row = measure(seq_len, sp, option, args.budget_gib)
        if fits(row):
            good, best_row, seq_len = seq_len, row, seq_len * 2
        elif over_budget(row):
            bad = seq_len
            break
        else:
            return good, best_row, failure(row)
    if bad is None:
        return good, best_row, "max_seq_len"
    while bad - good > step:
        middle = (good + bad) // 2 // step * step
        row = measure(middle, sp, option, args.budget_gib)
        if fits(row):
            good, best_row = middle, row
        elif over_budget(row):
            bad = middle
        else:
            return good, best_row, failure(row)
    return good, best_row, "budget"


def write_longest(path, longest, budget_gib):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sp", "zero_stage", "checkpointing", "head_chunks", "tiled_mlp", "offload",
                         "ring", "budget_gib", "tokens_per_s", "ended_by", "longest_seq_len"])
        for (sp, (zero, ck, u, tiles, offload, ring)), (good, row, ended_by) in longest.items():
            speed = row["tokens_per_s"] if row else ""
            writer.writerow([sp, zero, ck, u, tiles, offload, ring, budget_gib, speed, ended_by,
                             good])
            found = f"{good or 'none fits'}" + (f" at {speed} tok/s" if row else "")
            if ended_by == "max_seq_len":
                found += " (every length tried up to --max-seq-len fits)"
            elif ended_by != "budget":
                found = f"search ended: {ended_by}; longest that fit before it: {good or 'none'}"
            print(f"longest sequence within {budget_gib} GiB per rank: sp {sp} zero {zero} {ck} "
                  f"U{u} tiles:{tiles} offload:{offload} ring:{ring}: {found}")


def counts(low):
    """An argparse type: a comma-separated list of counts of at least low, each as written or
    with k (1024) or m (1048576), as `ulysses-train plan --seq` takes them."""
    def parse(text):
        values = []
        for part in text.split(","):
            match = re.fullmatch(r"\s*([0-9]+)([kKmM]?)\s*", part)
            if not match:
                raise argparse.ArgumentTypeError(f"'{part}' is not a count (e.g. 32k, 1m, 500000)")
            value = int(match.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[match.group(2).lower()]
            if value < low:
                raise argparse.ArgumentTypeError(f"'{part}' is below {low}")
            values.append(value)
        return values
    return parse


def check_overrides(sets):
    for extra in sets:
        key = extra.split("=", 1)[0].strip()
        if "=" not in extra:
            raise SweepRefused(f"--set {extra!r} is not key=value")
        if key in SWEEP_KEYS:
            option = SWEEP_KEYS[key]
            raise SweepRefused(f"--set {key} would override what the sweep sets for each run" +
                               (f": choose it with {option}" if option else
                                " (docs/sweep.md)"))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=os.path.join(REPOSITORY, "configs/passkey-tiny.yaml"))
    parser.add_argument("--binary", default=os.path.join(REPOSITORY, "build/apps/ulysses-train"))
    parser.add_argument("--seq-lens", type=counts(2), default="256,512,1024,2048",
                        help="sequence lengths, e.g. 4k,32k,128k (with --budget-gib: the first "
                             "is where the search starts)")
    parser.add_argument("--sp", type=counts(1), default="1,2,4",
                        help="parallel.sp values; each run has sp ranks")
    parser.add_argument("--zero", default="0,1")
    parser.add_argument("--checkpointing", default="none,layer")
    parser.add_argument("--head-chunks", default="1",
                        help="parallel.head_chunks values (UPipe), e.g. 1,4")
    parser.add_argument("--tiled-mlp", default="false",
                        help="memory.tiled_mlp values, e.g. false,auto")
    parser.add_argument("--offload", default="false",
                        help="memory.offload_checkpoints values (with layer checkpointing only)")
    parser.add_argument("--ring", type=counts(1), default="1",
                        help="parallel.ring values (Ulysses x ring; each must divide the sp of the "
                             "run, whose ranks stay sp), e.g. 1,2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budget-gib", type=float, default=0.0,
                        help="find the longest sequence whose per-rank peak fits this budget")
    parser.add_argument("--max-seq-len", type=int, default=1 << 22)
    parser.add_argument("--timeout", type=int, default=600,
                        help="seconds per run; a run that timed out is measured again when the "
                             "sweep continues")
    parser.add_argument("--set", action="append", default=[],
                        help="extra trainer override key=value (not a key the sweep sets)")
    parser.add_argument("--out", default="sweep",
                        help="folder of sweep.csv, sweep.json, longest.csv and the plots; one that "
                             "holds a sweep with the same settings is continued")
    parser.add_argument("--from-csv", action="extend", nargs="+",
                        help="draw the plots of earlier sweeps' sweep.csv files (one or more, "
                             "repeatable) into --out instead of running")
    args = parser.parse_args()
    if args.from_csv:
        try:
            rows = read_rows(args.from_csv)
        except OSError as error:
            print(f"sweep: cannot read {error.filename}: {error.strerror}", file=sys.stderr)
            return 2
        except (KeyError, ValueError, TypeError) as error:
            print(f"sweep: --from-csv {' '.join(args.from_csv)}: not the sweep.csv of a sweep "
                  f"({type(error).__name__}: {error})", file=sys.stderr)
            return 2
        os.makedirs(args.out, exist_ok=True)
        plot(rows, args.out)
        print(f"sweep: plots of {len(args.from_csv)} sweep(s) in {args.out}")
        return 0
    if not os.access(args.binary, os.X_OK):
        print(f"sweep: {args.binary} is missing; run scripts/setup.sh first", file=sys.stderr)
        return 2
    if not os.path.isfile(args.config):
        print(f"sweep: --config {args.config} is not a file", file=sys.stderr)
        return 2
    options = [(int(zero), ck, int(u), tiles, offload, ring)
               for zero in args.zero.split(",") for ck in args.checkpointing.split(",")
               for u in args.head_chunks.split(",") for tiles in args.tiled_mlp.split(",")
               for offload in args.offload.split(",") for ring in args.ring
               if offload == "false" or ck == "layer"]  # offloading needs checkpoints
    # A ring degree runs inside an sp group: it must divide sp (ring 1 always does).
    combos = [(sp, option) for sp in args.sp for option in options
              if sp % option[-1] == 0]  # option[-1]: the ring degree
    for ring in args.ring:
        if not any(sp % ring == 0 for sp in args.sp):
            print(f"sweep: --ring {ring} divides none of --sp {','.join(map(str, args.sp))}: a ring "
                  "runs inside an sp group of a multiple of its degree", file=sys.stderr)
            return 2
    settings = {"config": os.path.abspath(args.config), "config_sha256": file_sha256(args.config),
                "steps": args.steps, "set": args.set, "budget_gib": args.budget_gib}
    signal.signal(signal.SIGTERM, raise_stopped)
    signal.signal(signal.SIGHUP, raise_stopped)
    try:
        check_overrides(args.set)
        os.makedirs(args.out, exist_ok=True)
        version = subprocess.run([args.binary, "--version"], capture_output=True, text=True)
        table = SweepTable(args.out, settings,
                           {"binary_sha256": file_sha256(args.binary),
                            "binary_version": version.stdout.strip() or "unknown"})
    except SweepRefused as refused:
        print(f"sweep: {refused}", file=sys.stderr)
        return 2

    # Runs so far, of how many (a budget search does not know how many it will take).
    progress = {"runs": 0, "of": len(combos) * len(args.seq_lens) if args.budget_gib <= 0 else 0}

    def measure(seq_len, sp, option, limit_gib, workdir):
        zero, ck, u, tiles, offload, ring = option
        key = row_key({"seq_len": seq_len, "sp": sp, "zero_stage": zero, "checkpointing": ck,
                       "head_chunks": u, "tiled_mlp": tiles, "offload": offload, "ring": ring})
        row = table.done.get(key)
        measured_before = row is not None
        started = time.monotonic()
        if not measured_before:
            row = run_one(args, seq_len, sp, option, limit_gib, workdir)
            table.record(row)
        progress["runs"] += 1
        count = f"[{progress['runs']}" + (f"/{progress['of']}]" if progress["of"] else "]")
        print(f"{count} seq {row['seq_len']:>8} sp {row['sp']} {option_label(row):<30} -> " +
              (f"{row['tokens_per_s']} tok/s, peak {row['peak_total_bytes'] / 2**20:.1f} MiB"
               if row["exit_status"] == 0 else f"FAILED ({row['error']})") +
              (" (in sweep.csv already)" if measured_before
               else f" ({time.monotonic() - started:.1f} s)"), flush=True)
        return row

    try:
        with tempfile.TemporaryDirectory() as workdir:
            run = lambda seq_len, sp, option, limit: measure(seq_len, sp, option, limit, workdir)
            if args.budget_gib <= 0:
                for sp, option in combos:
                    for seq_len in args.seq_lens:
                        run(seq_len, sp, option, 0)
            else:
                longest = {(sp, option): longest_within_budget(run, sp, option, args)
                           for sp, option in combos}
                write_longest(os.path.join(args.out, "longest.csv"), longest, args.budget_gib)
    except (KeyboardInterrupt, Stopped) as stop:
        signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
        print(f"sweep: stopped by {signal.Signals(signum).name}: {len(table.rows)} run(s) in "
              f"{table.csv_path}; the same command continues the sweep", file=sys.stderr)
        return 128 + signum
    finally:
        table.close()
    plot(table.rows, args.out)
    print(f"sweep: wrote {args.out}/sweep.csv" +
          (f" and {args.out}/longest.csv" if args.budget_gib > 0 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
