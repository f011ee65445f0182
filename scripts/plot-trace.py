#!/usr/bin/env python3
"""Draws a trace written by log.trace_file as a timeline PNG (docs/profiling.md).

Each rank gets one row, and time runs to the right. Each span is coloured by its phase: nested
spans are drawn over their parent, and the "step" span itself is light grey. A thin band under
each row shows the collectives in flight. This is the same picture Perfetto shows, for people
who would rather look than click. It needs gnuplot (scripts/setup.sh installs gnuplot-nox).

    scripts/plot-trace.py trace.json trace.png [--steps N] [--width PIXELS]
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile

# One colour per phase; anything else is grey.
COLOURS = {
    "step": "#e6e6e6",
    "data": "#8c564b",
    "embedding": "#c49c94",
    "qkv projection": "#1f77b4",
    "output projection": "#aec7e8",
    "mlp": "#2ca02c",
    "attention forward": "#ff7f0e",
    "attention backward": "#ffbb78",
    "loss": "#9467bd",
    "recompute": "#c5b0d5",
    "all-to-all copies": "#f7b6d2",
    "all-to-all wait": "#d62728",
    "weight gather wait": "#e377c2",
    "gradient reduction wait": "#bcbd22",
    "scalar all-reduce": "#7f7f7f",
    "optimizer": "#17becf",
    "all-to-all (in flight)": "#ff9896",
    "weight gather (in flight)": "#f7b6d2",
    "gradient reduction (in flight)": "#dbdb8d",
}


def read_spans(path):
    """The complete ("X") events of a trace file; a file that cannot be read or is not a
    trace ends the script with exit status 2, naming it."""
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        return [e for e in events if e.get("ph") == "X"]
    except OSError as error:
        print(f"plot-trace: cannot read {path}: {error.strerror}", file=sys.stderr)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        print(f"plot-trace: {path} is not a trace file written by log.trace_file "
              f"({type(error).__name__}: {error})", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("png")
    parser.add_argument("--steps", type=int, default=0,
                        help="draw only the first N steps of rank 0's timeline (0 = all)")
    parser.add_argument("--width", type=int, default=1600)
    args = parser.parse_args()
    if not shutil.which("gnuplot"):
        sys.exit("plot-trace: gnuplot not found (apt-get install gnuplot-nox)")
    spans = read_spans(args.trace)
    if not spans:
        sys.exit(f"plot-trace: {args.trace} holds no spans")

    ranks = sorted({s["pid"] for s in spans})
    end = max(s["ts"] + s["dur"] for s in spans)
    if args.steps > 0:
        steps = sorted((s for s in spans if s["name"] == "step" and s["pid"] == ranks[0]),
                       key=lambda s: s["ts"])
        if len(steps) > args.steps:
            end = steps[args.steps]["ts"]
    start = min(s["ts"] for s in spans)
    spans = [s for s in spans if s["ts"] < end]

    objects = []
    # Longest first, so that nested spans land on top of their parents.
    for s in sorted(spans, key=lambda s: -s["dur"]):
        row = ranks.index(s["pid"])
        x0 = (s["ts"] - start) / 1e3
        x1 = (min(s["ts"] + s["dur"], end) - start) / 1e3
        if s["tid"] == 0:
            y0, y1 = row + 0.25, row + 0.95
        else:
            y0, y1 = row + 0.02, row + 0.2
        colour = COLOURS.get(s["name"], "#999999")
        objects.append(f"set object rect from {x0},{y0} to {x1},{y1} "
                       f"fc rgb '{colour}' fs solid 1.0 noborder")

    present = [name for name in COLOURS if any(s["name"] == name for s in spans)]
    legend = ", ".join(f"NaN with boxes fc rgb '{COLOURS[name]}' fs solid title '{name}'"
                       for name in present)
    labels = ", ".join(f"'rank {rank}' {i + 0.6}" for i, rank in enumerate(ranks))
    height = 140 + 70 * len(ranks)
    script = "\n".join([
        f"set terminal png size {args.width},{height}",
        f"set output '{args.png}'",
        f"set xrange [0:{(end - start) / 1e3}]",
        f"set yrange [0:{len(ranks)}]",
        f"set ytics ({labels})",
        "set xlabel 'ms since the trace started (thin band: collectives in flight)'",
        "set key outside right top vertical font ',8'",
        "unset grid",
        *objects,
        f"plot {legend}",
    ])
    with tempfile.NamedTemporaryFile("w", suffix=".gp", delete=False) as f:
        f.write(script)
        script_path = f.name
    subprocess.run(["gnuplot", script_path], check=True)
    print(f"plot-trace: {len(spans)} spans of {len(ranks)} ranks drawn to {args.png}")


if __name__ == "__main__":
    main()
