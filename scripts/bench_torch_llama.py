#!/usr/bin/env python3
"""PyTorch peer for scripts/gpu-check.sh (a benchmark, not a test): a Llama-shaped model
trained for a few steps on one GPU, as the trainer trains it with device: cuda, so that
tokens/s and memory are compared side by side on the same GPU and shapes (docs/cuda.md).

Mixed precision as ulysses runs it: fp32 master weights and AdamW state (fused AdamW), bf16
autocast compute, causal scaled_dot_product_attention with grouped-query attention, RMSNorm,
RoPE, SwiGLU, an untied LM head, global-norm clipping. --checkpointing wraps every block in
torch.utils.checkpoint (memory.activation_checkpointing: layer).

Usage: scripts/bench_torch_llama.py --layers L --d-model D --heads H --kv-heads KV --d-ff FF
       --vocab V --seq T [--steps S] [--checkpointing]
Prints one JSON line: tokens/s and ms of the last step (the first pays for kernel selection and
the allocator's growth), the peak of torch.cuda.max_memory_allocated, the last loss.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("layers", "d-model", "heads", "kv-heads", "d-ff", "vocab", "seq"):
        parser.add_argument("--" + name, type=int, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rope-theta", type=float, default=500000.0)
    parser.add_argument("--checkpointing", action="store_true")
    return parser.parse_args()


ARGS = parse_args()
HEAD_DIM = ARGS.d_model // ARGS.heads
DEVICE = "cuda"


def weight(*shape):
    return torch.nn.Parameter(torch.randn(*shape, device=DEVICE) * 0.02)


def ones(width):
    return torch.nn.Parameter(torch.ones(width, device=DEVICE))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        d, hd = ARGS.d_model, HEAD_DIM
        self.attention_norm, self.mlp_norm = ones(d), ones(d)
        self.wq, self.wo = weight(ARGS.heads * hd, d), weight(d, ARGS.heads * hd)
        self.wk, self.wv = weight(ARGS.kv_heads * hd, d), weight(ARGS.kv_heads * hd, d)
        self.gate, self.up, self.down = weight(ARGS.d_ff, d), weight(ARGS.d_ff, d), weight(d, ARGS.d_ff)

    def forward(self, x, cos, sin):
        batch, seq, d = x.shape
        h = F.rms_norm(x, (d,), self.attention_norm, 1e-5)
        q = F.linear(h, self.wq).view(batch, seq, ARGS.heads, HEAD_DIM).transpose(1, 2)
        k = F.linear(h, self.wk).view(batch, seq, ARGS.kv_heads, HEAD_DIM).transpose(1, 2)
        v = F.linear(h, self.wv).view(batch, seq, ARGS.kv_heads, HEAD_DIM).transpose(1, 2)
        out = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v,
                                             is_causal=True, enable_gqa=True)
        x = x + F.linear(out.transpose(1, 2).reshape(batch, seq, d), self.wo)
        h = F.rms_norm(x, (d,), self.mlp_norm, 1e-5)
        return x + F.linear(F.silu(F.linear(h, self.gate)) * F.linear(h, self.up), self.down)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = weight(ARGS.vocab, ARGS.d_model)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(ARGS.layers))
        self.final_norm = ones(ARGS.d_model)
        self.head = weight(ARGS.vocab, ARGS.d_model)

    def forward(self, tokens, targets):
        inverse = 1.0 / ARGS.rope_theta ** (
            torch.arange(0, HEAD_DIM, 2, device=DEVICE).float() / HEAD_DIM)
        angles = torch.outer(torch.arange(tokens.shape[1], device=DEVICE).float(), inverse)
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embedding[tokens]
        for block in self.blocks:
            if ARGS.checkpointing:
                x = checkpoint(block, x, cos, sin, use_reentrant=False)
            else:
                x = block(x, cos, sin)
        logits = F.linear(F.rms_norm(x, (ARGS.d_model,), self.final_norm, 1e-5), self.head)
        return F.cross_entropy(logits.float().view(-1, ARGS.vocab), targets.view(-1))


def main():
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, ARGS.vocab, (1, ARGS.seq), device=DEVICE)
    targets = torch.randint(0, ARGS.vocab, (1, ARGS.seq), device=DEVICE)
    step_seconds = []
    for _ in range(ARGS.steps):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_seconds.append(time.perf_counter() - begin)
    print(json.dumps({"peer": "pytorch " + torch.__version__, "seq": ARGS.seq,
                      "checkpointing": ARGS.checkpointing,
                      "tokens_per_s": ARGS.seq / step_seconds[-1],
                      "step_ms": step_seconds[-1] * 1e3,
                      "peak_bytes": torch.cuda.max_memory_allocated(), "loss": loss.item()}))


if __name__ == "__main__":
    main()
