#!/usr/bin/env python3
"""The Llama-1B table of scripts/gpu-check.sh (docs/cuda.md, "Checking on a GPU").

For each sequence length: cuBLASLt alone on the layer's GEMM shapes (ulysses-bench-gemm), then
ulysses-train with cuDNN attention, the native kernels and cuDNN with layer checkpointing, each
printing its startup lines, its end-of-run table (device time: each phase's share and rate)
and verdict; then one table: tokens/s, step ms, MFU against the peak, the device's busy
share, the loss phase's ms, the step's GEMM phases' rate beside cuBLASLt's alone, peak
tracked memory beside the planner's prediction, and where a PyTorch peer runs
(scripts/bench_torch_llama.py) its tokens/s, peak and the ratio.

Every run trains on the same random-token shard (data.source: tokens), so every target
counts in the loss as in the PyTorch peer's cross-entropy over all tokens: the LM head does
the same work on both sides.

    scripts/gpu_table.py --binary BUILD/apps/ulysses-train --logs DIR [--torch]
    scripts/gpu_table.py ... --rows cudnn --set memory.loss_tile_tokens=256 (the loss tile)
    scripts/gpu_table.py ... --device cpu --shape 1,64,4,2,128,512 --seqs 128 (a smoke test)
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys

PARSER = argparse.ArgumentParser(description=__doc__.splitlines()[0])
PARSER.add_argument("--binary", required=True, help="ulysses-train (ulysses-bench-gemm beside it)")
PARSER.add_argument("--logs", required=True, help="folder for configs, logs and metrics")
PARSER.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
PARSER.add_argument("--shape", default="16,2048,32,8,8192,32000",
                    help="layers,d_model,heads,kv_heads,d_ff,vocab (default: Llama-1B)")
PARSER.add_argument("--seqs", default="8192,32768", help="comma-separated sequence lengths")
PARSER.add_argument("--peak-tflops", type=float, default=989.0,
                    help="the MFU's denominator (H200 dense bf16: 989)")
PARSER.add_argument("--rows", default=None,
                    help="comma-separated runs, each ATTENTION or ATTENTION+layer (layer "
                         "checkpointing); default cudnn,native,cudnn+layer on cuda, "
                         "native,native+layer on the cpu")
PARSER.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (e.g. memory.loss_tile_tokens=256)")
PARSER.add_argument("--torch", action="store_true", help="run the PyTorch peer beside each")
PARSER.add_argument("--timeout", type=int, default=150, help="seconds per run")
ARGS = PARSER.parse_args()

LAYERS, D, HEADS, KV, FF, VOCAB = (int(v) for v in ARGS.shape.split(","))
SEQS = [int(v) for v in ARGS.seqs.split(",")]
BENCH_GEMM = os.path.join(os.path.dirname(ARGS.binary), "ulysses-bench-gemm")
CONFIG = os.path.join(ARGS.logs, "model.yaml")
SHARD = os.path.join(ARGS.logs, "random_tokens.bin")
# (attention, layer checkpointing, steps): the native kernels' slow runs take one step less.
# The cpu backend has one attention, its own.
DEFAULT_ROWS = "cudnn,native,cudnn+layer" if ARGS.device == "cuda" else "native,native+layer"
ROWS = [(row.split("+")[0], row.endswith("+layer"), 2 if row.startswith("native") else 3)
        for row in (ARGS.rows or DEFAULT_ROWS).split(",")]
GEMM_PHASES = ("qkv projection", "output projection", "mlp")


def write_random_shard(path, tokens):
    # An llm.c token shard (docs/configuration.md, "tokens"): 256 int32 of header, then uint16
    # tokens.
    assert VOCAB <= 1 << 16, "a uint16 shard holds token ids below 65536"
    rng = random.Random(0)
    header = struct.pack("<256i", 20240520, 1, tokens, *([0] * 253))
    body = struct.pack(f"<{tokens}H", *(rng.randrange(VOCAB) for _ in range(tokens)))
    with open(path, "wb") as f:
        f.write(header + body)


def shape_overrides(seq, attention, checkpointing, steps):
    values = {"model.n_layers": LAYERS, "model.d_model": D, "model.n_heads": HEADS,
              "model.n_kv_heads": KV, "model.d_ff": FF, "model.vocab_size": VOCAB,
              "model.max_seq_len": seq, "train.seq_len": seq, "train.steps": steps,
              "memory.activation_checkpointing": "layer" if checkpointing else "none"}
    if ARGS.device == "cuda":
        values["kernels.attention"] = attention
    return ([arg for key, value in values.items() for arg in ("--set", f"{key}={value}")] +
            [arg for override in ARGS.set for arg in ("--set", override)])


def flops_per_token(seq):
    # 6 per parameter in matmuls (forward and backward) + causal attention, 6·L·T·d.
    hd = D // HEADS
    params = LAYERS * (2 * D * D + 2 * D * KV * hd + 3 * D * FF + 2 * D) + 2 * VOCAB * D + D
    return 6 * params + 6 * LAYERS * seq * D


def gib(n):
    return f"{n / 2**30:.1f} GiB"


def planned_peak(seq, attention, checkpointing):
    run = subprocess.run([ARGS.binary, "--config", CONFIG, "--dry-run"] +
                         shape_overrides(seq, attention, checkpointing, 1),
                         capture_output=True, text=True, timeout=120)
    for line in run.stdout.splitlines():
        if line.startswith("#   total:"):
            return line.split("step peak")[-1].strip()
    return "?"


def ulysses(seq, attention, checkpointing, steps):
    name = f"{attention}-{'layer' if checkpointing else 'plain'}-{seq}"
    metrics = os.path.join(ARGS.logs, name + ".jsonl")
    log = os.path.join(ARGS.logs, name + ".log")
    try:
        with open(log, "w") as out:
            run = subprocess.run([ARGS.binary, "--config", CONFIG,
                                  "--set", f"log.metrics_file={metrics}"] +
                                 shape_overrides(seq, attention, checkpointing, steps),
                                 stdout=out, stderr=subprocess.STDOUT, timeout=ARGS.timeout)
        status = run.returncode
    except subprocess.TimeoutExpired:
        status = "timeout"
    text = open(log).read()
    if status != 0:
        print(f"gpu-check: {name} ended with {status}:\n" + "\n".join(text.splitlines()[-15:]),
              file=sys.stderr)
        return None
    steps_seen = [json.loads(l) for l in open(metrics) if '"tokens_per_s"' in l]
    # The last step: the first pays for cuBLASLt plans, cuDNN graphs and the memory pool.
    last = steps_seen[-1]
    lines = text.splitlines()
    # Where the time before the first step went, and what the first steps built.
    last["startup"] = [l.split("]", 1)[-1].strip() for l in lines
                       if "startup:" in l or " built " in l]
    # The end-of-run table (each phase's share and rate) and the verdict.
    first = next((i for i, l in enumerate(lines) if "where the step time went" in l), len(lines))
    last["time_table"] = [l.split("] ", 1)[-1] for l in lines[first:]
                          if l.startswith("  ") or "verdict" in l or "where the step" in l]
    return last


def gemm_phase_rate(phases):
    # The step's GEMM phases (the mlp's also holds its SwiGLU): their FLOPs over their time.
    flops = sum(phases.get(name, {}).get("flops", 0) for name in GEMM_PHASES)
    seconds = sum(phases.get(name, {}).get("s", 0) for name in GEMM_PHASES)
    return flops / seconds if seconds > 0 else None


def gemm_shapes(seq):
    # Each weight W [out, in] of a layer: y = x·Wᵀ, dx = dy·W, dW = dyᵀ·x (ulysses-bench-gemm's
    # MxNxK:ab); q, k, v, o, gate, up, down, as the layer runs them on one rank (sp 1).
    hd = D // HEADS
    weights = [(HEADS * hd, D), (KV * hd, D), (KV * hd, D), (D, HEADS * hd), (FF, D), (FF, D),
               (D, FF)]
    shapes = []
    for out, inp in weights:
        shapes += [f"{seq}x{out}x{inp}:nt", f"{seq}x{inp}x{out}:nn", f"{out}x{inp}x{seq}:tn"]
    return ",".join(shapes)


def tool_output(command, what):
    # The stdout of a helper that ran to success, or None with why on stderr.
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=ARGS.timeout)
    except subprocess.TimeoutExpired:
        print(f"gpu-check: {what} timed out", file=sys.stderr)
        return None
    if run.returncode != 0:
        print(f"gpu-check: {what} failed:\n{run.stderr[-1500:]}", file=sys.stderr)
        return None
    return run.stdout


def gemm_alone_rate(seq):
    # The backend's GEMM alone on the layer's shapes, FLOP-weighted (device time on cuda).
    out = tool_output([BENCH_GEMM, "--device", ARGS.device, "--shapes", gemm_shapes(seq)],
                      f"ulysses-bench-gemm at {seq}")
    if out is None:
        return None
    print(out, end="", flush=True)
    for line in out.splitlines():
        if line.startswith("all "):
            return float(line.split(": ")[1].split()[0]) * 1e12
    return None


def torch_run(seq, checkpointing):
    if not ARGS.torch:
        return None
    command = [sys.executable, os.path.join(os.path.dirname(__file__), "bench_torch_llama.py"),
               "--layers", str(LAYERS), "--d-model", str(D), "--heads", str(HEADS),
               "--kv-heads", str(KV), "--d-ff", str(FF), "--vocab", str(VOCAB), "--seq", str(seq),
               "--steps", "3"]
    if checkpointing:
        command.append("--checkpointing")
    out = tool_output(command, f"the PyTorch peer at {seq}")
    return json.loads(out.strip().splitlines()[-1]) if out is not None else None


def main():
    os.makedirs(ARGS.logs, exist_ok=True)
    # Enough tokens for the longest run's sequences after the validation hold-out.
    write_random_shard(SHARD, max(1 << 19, 8 * (max(SEQS) + 1)))
    with open(CONFIG, "w") as f:
        f.write(f"device: {ARGS.device}\nmodel: {{family: llama, rope_theta: 500000}}\n"
                "train: {batch_size: 1, lr: 1.0e-4, warmup_steps: 0, grad_clip: 1.0}\n"
                f"data: {{source: tokens, path: {SHARD}}}\nlog: {{every: 1}}\n")
    table = []
    failed = 0
    if ARGS.set:
        print(f"   every run with --set {' --set '.join(ARGS.set)}", flush=True)
    for seq in SEQS:
        peers = {}
        print(f"   {ARGS.device} GEMMs alone on the layer's shapes at {seq} tokens:", flush=True)
        gemm_alone = gemm_alone_rate(seq)
        for attention, checkpointing, steps in ROWS:
            label = attention + (" + layer ckpt" if checkpointing else "")
            result = ulysses(seq, attention, checkpointing, steps)
            if checkpointing not in peers:
                peers[checkpointing] = torch_run(seq, checkpointing)
            peer = peers[checkpointing]
            plan = planned_peak(seq, attention, checkpointing)
            if result is None:
                failed += 1
                table.append([label, seq, "failed"] + ["-"] * 11)
                continue
            tps = result["tokens_per_s"]
            busy = result.get("device_busy")
            phases = result.get("phases", {})
            gemm_rate = gemm_phase_rate(phases)
            table.append([
                label, seq, f"{tps:,.0f}", f"{result['step_ms']:,.0f}",
                f"{100 * tps * flops_per_token(seq) / (ARGS.peak_tflops * 1e12):.1f}%",
                f"{100 * busy:.0f}%" if busy is not None else "-",
                f"{1e3 * phases['loss']['s']:.1f}" if "loss" in phases else "-",
                f"{gemm_rate / 1e12:.3g}" if gemm_rate is not None else "-",
                f"{gemm_alone / 1e12:.3g}" if gemm_alone is not None else "-",
                gib(result["mem_peak_bytes"]["total"]), plan,
                f"{peer['tokens_per_s']:,.0f}" if peer else "-",
                gib(peer["peak_bytes"]) if peer else "-",
                f"{tps / peer['tokens_per_s']:.2f}x" if peer else "-"])
            print(f"   {label} {seq}: {table[-1][2]} tokens/s", flush=True)
            for line in result["startup"] + result["time_table"]:
                print(f"      {line}", flush=True)

    header = ["run", "tokens", "tok/s", "step ms", "MFU", "busy", "loss ms", "GEMM TFLOP/s",
              "GEMMs alone", "peak tracked", "planned", "torch tok/s", "torch peak", "vs torch"]
    widths = [max(len(str(row[i])) for row in table + [header]) for i in range(len(header))]
    print()
    for row in [header] + table:
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
