#!/usr/bin/python3
"""PyTorch baseline for scripts/bench-cpu.sh (a benchmark, not a test): GPT-2 124M training
steps on the CPU in fp32, written as nanoGPT writes it (torch.nn modules, causal attention
through a [T, T] score matrix, AdamW), so the trainer's tokens/s can be compared with
PyTorch's as a ratio measured in one session (docs/performance.md).

Usage: /usr/bin/python3 scripts/bench_torch_gpt2.py [--batch B] [--seq T] [--steps S]
       [--threads N]
Prints one line: torch gpt2-124m B=.. T=..: <step s> s/step, <tokens/s> tok/s (the mean of the
steps after the first), the threads and the process's peak resident memory.
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, LAYERS, WIDTH, HEADS, CONTEXT = 50257, 12, 768, 12, 1024


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.c_fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.mlp_proj = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x, future):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // HEADS)
        y = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x, future)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied LM head, as GPT-2
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args()
    if not 1 <= args.seq <= CONTEXT or args.batch < 1 or args.steps < 2:
        parser.error(f"need 1 <= --seq <= {CONTEXT}, --batch >= 1 and --steps >= 2")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    tokens = torch.randint(VOCAB, (args.batch, args.seq + 1))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    step = sum(times[1:]) / len(times[1:])
    print(f"torch gpt2-124m B={args.batch} T={args.seq}: {step:.2f} s/step, "
          f"{args.batch * args.seq / step:.0f} tok/s ({torch.get_num_threads()} threads), "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
