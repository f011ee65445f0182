#!/usr/bin/python3
"""Self-check of the PyTorch reference (reference_model.py); exits 1 on any mismatch.

    /usr/bin/python3 tests/reference/check_reference.py

1. Gradients: autograd against float64 central finite differences, a sample of
   coordinates of every parameter, for tiny llama (GQA) and gpt2 models.
2. Forward: the reference against an independent formulation written differently
   (per-head, per-position loops; kv head by index; RoPE as complex rotation of
   (i, i + d/2) pairs; einsum with sliced weight rows; hand-written cross-entropy), for
   the attention alone and for the whole model (loss and gradients).
3. Sensitivity: typical bugs (interleaved RoPE pairs, wrong GQA head mapping, no
   causal mask, erf GELU) change the loss of the test models, so the checks above
   and the trainer tests built on them would notice such a bug.
4. Command line: DIR mode writes the expected reference.safetensors; bad inputs fail
   cleanly; --hf-checkpoint writes a BF16 checkpoint whose expected loss matches the
   independent formulation on the weights read back from the files.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

import reference_model as ref
import safetensors_io

HERE = os.path.dirname(os.path.abspath(__file__))

TINY = {
    "llama": {"family": "llama", "n_layers": 2, "d_model": 16, "n_heads": 4, "n_kv_heads": 2,
              "d_ff": 24, "vocab_size": 13, "max_seq_len": 8, "rope_theta": 10000.0,
              "norm_eps": 1e-5},
    "gpt2": {"family": "gpt2", "n_layers": 2, "d_model": 16, "n_heads": 4, "n_kv_heads": 4,
             "d_ff": 64, "vocab_size": 13, "max_seq_len": 8, "rope_theta": 10000.0,
             "norm_eps": 1e-5},
}

failures = []


def check(ok, message):
    print(("ok    " if ok else "FAIL  ") + message)
    if not ok:
        failures.append(message)


def tiny_case(family, seed=0):
    cfg = ref.validate_config(TINY[family])
    params = {name: t.double() for name, t in ref.random_parameters(cfg, seed).items()}
    batch = ref.random_batch(cfg, batch_size=2, seq_len=6, seed=seed)
    batch["targets"][0][2] = -1  # uncounted targets must not contribute
    batch["targets"][1][5] = -1
    inputs, targets = ref.validate_batch(batch, cfg)
    return cfg, params, inputs, targets


# ----------------------------------------------------------------------------- 1. gradients

def check_finite_differences(family, samples=6, step=1e-5):
    cfg, params, inputs, targets = tiny_case(family)
    _, grads = ref.loss_and_gradients(params, cfg, inputs, targets)
    generator = torch.Generator().manual_seed(1)
    worst = 0.0
    checked = 0
    for name, _ in ref.parameter_shapes(cfg):
        flat_size = params[name].numel()
        for index in torch.randperm(flat_size, generator=generator)[:samples].tolist():
            def loss_at(delta):
                moved = params[name].clone()
                moved.view(-1)[index] += delta
                with torch.no_grad():
                    return ref.model_loss({**params, name: moved}, cfg, inputs, targets).item()

            numeric = (loss_at(step) - loss_at(-step)) / (2 * step)
            analytic = grads[name].view(-1)[index].item()
            # Central differences in float64: truncation ~step² (relative), round-off
            # ~1e-16·loss/step ≈ 1e-10 (absolute, what a zero gradient such as the key
            # bias's shows).
            ratio = abs(numeric - analytic) / (1e-9 + 1e-5 * abs(analytic))
            worst = max(worst, ratio)
            checked += 1
            if ratio > 1:
                check(False, f"{family} {name}[{index}]: autograd {analytic!r} vs "
                             f"finite difference {numeric!r}")
    check(worst <= 1, f"{family}: {checked} gradient coordinates match finite differences "
                      f"(worst error {worst:.2f} of the tolerance 1e-9 + 1e-5·|gradient|)")


# ----------------------------------------------------------------------------- 2. forward

def loop_attention(q, k, v, kv_of_head, causal=True):
    """Per (sequence, head, query position) softmax over keys, written out."""
    B, H, T, d = q.shape
    batch_out = []
    for b in range(B):
        head_out = []
        for h in range(H):
            kv = kv_of_head(h)
            rows = []
            for t in range(T):
                visible = t + 1 if causal else T
                scores = torch.stack([torch.dot(q[b, h, t], k[b, kv, j]) for j in range(visible)])
                scores = scores / math.sqrt(d)
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                rows.append(sum(weights[j] * v[b, kv, j] for j in range(visible)))
            head_out.append(torch.stack(rows))
        batch_out.append(torch.stack(head_out))
    return torch.stack(batch_out)


def complex_rope(x, theta, interleaved=False):
    """x [B, heads, T, d]; rotates pair (i, i + d/2) by angle pos·theta^(-2i/d) as a complex
    product. interleaved=True pairs (2i, 2i+1) instead: the classic wrong convention."""
    d, T = x.shape[-1], x.shape[-2]
    half = d // 2
    angles = torch.tensor([[pos * math.pow(theta, -2.0 * i / d) for i in range(half)]
                           for pos in range(T)], dtype=torch.float64)
    rotation = torch.polar(torch.ones_like(angles), angles)
    if interleaved:
        pairs = torch.complex(x[..., 0::2], x[..., 1::2]) * rotation
        return torch.stack((pairs.real, pairs.imag), dim=-1).flatten(-2)
    pairs = torch.complex(x[..., :half], x[..., half:]) * rotation
    return torch.cat((pairs.real, pairs.imag), dim=-1)


def heads_from_rows(x, weight, n_heads):
    """Head h of x·Wᵀ is x times rows h·d .. h·d+d-1 of W: [B, n_heads, T, d]."""
    d = weight.shape[0] // n_heads
    return torch.stack([torch.einsum("btc,oc->bto", x, weight[h * d:(h + 1) * d])
                        for h in range(n_heads)], dim=1)


def manual_cross_entropy(logits, targets):
    total = 0.0
    count = 0
    for b in range(targets.shape[0]):
        for t in range(targets.shape[1]):
            y = int(targets[b, t])
            if y < 0:
                continue
            row = logits[b, t]
            peak = row.max()
            total = total + peak + torch.log(torch.exp(row - peak).sum()) - row[y]
            count += 1
    return total / count


def independent_llama_loss(params, cfg, inputs, targets, variant="correct", tied=False):
    H, Hkv, eps, C = cfg["n_heads"], cfg["n_kv_heads"], cfg["norm_eps"], cfg["d_model"]
    group = H // Hkv
    kv_of_head = (lambda h: h % Hkv) if variant == "modulo_kv" else (lambda h: h // group)

    def norm(x, weight):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) / C + eps) * weight

    def linear(x, weight):
        return torch.einsum("btc,oc->bto", x, weight)

    x = torch.stack([torch.stack([params["model.embed_tokens.weight"][int(token)]
                                  for token in row]) for row in inputs])
    for i in range(cfg["n_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, params[p + "input_layernorm.weight"])
        interleaved = variant == "interleaved_rope"
        q = complex_rope(heads_from_rows(h, params[p + "self_attn.q_proj.weight"], H),
                         cfg["rope_theta"], interleaved)
        k = complex_rope(heads_from_rows(h, params[p + "self_attn.k_proj.weight"], Hkv),
                         cfg["rope_theta"], interleaved)
        v = heads_from_rows(h, params[p + "self_attn.v_proj.weight"], Hkv)
        y = loop_attention(q, k, v, kv_of_head, causal=variant != "no_causal_mask")
        y = torch.cat([y[:, head] for head in range(H)], dim=-1)
        x = x + linear(y, params[p + "self_attn.o_proj.weight"])
        h = norm(x, params[p + "post_attention_layernorm.weight"])
        gate = linear(h, params[p + "mlp.gate_proj.weight"])
        x = x + linear(gate / (1 + torch.exp(-gate)) * linear(h, params[p + "mlp.up_proj.weight"]),
                       params[p + "mlp.down_proj.weight"])
    x = norm(x, params["model.norm.weight"])
    head = params["model.embed_tokens.weight" if tied else "lm_head.weight"]
    return manual_cross_entropy(linear(x, head), targets)


def independent_gpt2_loss(params, cfg, inputs, targets, variant="correct"):
    C, H, eps = cfg["d_model"], cfg["n_heads"], cfg["norm_eps"]
    wte, wpe = params["transformer.wte.weight"], params["transformer.wpe.weight"]

    def linear(x, weight, bias):
        return torch.einsum("btc,oc->bto", x, weight) + bias

    x = torch.stack([torch.stack([wte[int(token)] + wpe[t] for t, token in enumerate(row)])
                     for row in inputs])
    for i in range(cfg["n_layers"]):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (C,), params[p + "ln_1.weight"], params[p + "ln_1.bias"], eps)
        w, b = params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"]
        q, k, v = (heads_from_rows(h, w[s * C:(s + 1) * C], H)
                   + b[s * C:(s + 1) * C].view(H, 1, -1) for s in range(3))
        y = loop_attention(q, k, v, lambda head: head, causal=variant != "no_causal_mask")
        y = torch.cat([y[:, head] for head in range(H)], dim=-1)
        x = x + linear(y, params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), params[p + "ln_2.weight"], params[p + "ln_2.bias"], eps)
        h = linear(h, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"])
        h = F.gelu(h, approximate="none" if variant == "erf_gelu" else "tanh")
        x = x + linear(h, params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), params["transformer.ln_f.weight"], params["transformer.ln_f.bias"],
                     eps)
    return manual_cross_entropy(torch.einsum("btc,vc->btv", x, wte), targets)


def independent_loss(params, cfg, inputs, targets, variant="correct"):
    if cfg["family"] == "llama":
        return independent_llama_loss(params, cfg, inputs, targets, variant)
    return independent_gpt2_loss(params, cfg, inputs, targets, variant)


def check_attention():
    generator = torch.Generator().manual_seed(2)
    for H, Hkv in ((6, 6), (6, 3), (6, 2), (6, 1)):
        q = torch.randn(2, H, 5, 4, generator=generator, dtype=torch.float64)
        k = torch.randn(2, Hkv, 5, 4, generator=generator, dtype=torch.float64)
        v = torch.randn(2, Hkv, 5, 4, generator=generator, dtype=torch.float64)
        group = H // Hkv
        difference = (ref.causal_attention(q, k, v)
                      - loop_attention(q, k, v, lambda h: h // group)).abs().max().item()
        check(difference < 1e-13, f"attention H={H} Hkv={Hkv}: batched GQA vs per-head loop "
                                  f"(max difference {difference:.1e})")
    x = torch.randn(2, 3, 7, 8, generator=generator, dtype=torch.float64)
    cos, sin = ref.rope_cos_sin(7, 8, 500.0)
    difference = (ref.apply_rope(x, cos, sin) - complex_rope(x, 500.0)).abs().max().item()
    check(difference < 1e-13, f"RoPE: rotate_half vs complex rotation (max difference "
                              f"{difference:.1e})")


def check_independent_forward(family):
    cfg, params, inputs, targets = tiny_case(family, seed=4)
    loss, grads = ref.loss_and_gradients(params, cfg, inputs, targets)
    leaves = {name: t.clone().requires_grad_(True) for name, t in params.items()}
    other = independent_loss(leaves, cfg, inputs, targets)
    other.backward()
    check(abs(loss - other.item()) <= 1e-12 * abs(loss),
          f"{family}: loss {loss!r} equals the independent formulation's {other.item()!r}")
    worst = max((grads[name] - leaves[name].grad).abs().max().item() /
                (1e-12 + grads[name].abs().max().item()) for name in params)
    check(worst < 1e-10, f"{family}: every gradient equals the independent formulation's "
                         f"(worst relative difference {worst:.1e})")
    return cfg, params, inputs, targets, loss


# ----------------------------------------------------------------------------- 3. sensitivity

def check_sensitivity(family, cfg, params, inputs, targets, loss):
    variants = {"llama": ("interleaved_rope", "modulo_kv", "no_causal_mask"),
                "gpt2": ("erf_gelu", "no_causal_mask")}[family]
    with torch.no_grad():
        for variant in variants:
            wrong = independent_loss(params, cfg, inputs, targets, variant).item()
            change = abs(wrong - loss) / abs(loss)
            check(change > 1e-6, f"{family}: the bug '{variant}' changes the loss by {change:.1e}")


# ----------------------------------------------------------------------------- 4. command line

def run(args):
    return subprocess.run([sys.executable, os.path.join(HERE, "reference_model.py")] + args,
                          capture_output=True, text=True)


def write_case(directory, cfg, params, inputs, targets):
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    safetensors_io.write_file(
        os.path.join(directory, "weights.safetensors"),
        [(name, "F32", shape, ref.flat_values(params[name]))
         for name, shape in ref.parameter_shapes(cfg)])
    with open(os.path.join(directory, "batch.json"), "w") as f:
        json.dump({"inputs": inputs.tolist(), "targets": targets.tolist()}, f)


def check_directory_mode(family):
    cfg, params, inputs, targets = tiny_case(family, seed=5)
    params = {name: t.float().double() for name, t in params.items()}  # what F32 files hold
    loss, grads = ref.loss_and_gradients(params, cfg, inputs, targets)
    with tempfile.TemporaryDirectory() as directory:
        write_case(directory, cfg, params, inputs, targets)
        result = run([directory])
        check(result.returncode == 0, f"{family}: reference_model.py DIR exits 0 "
                                      f"{result.stderr.strip()}")
        if result.returncode != 0:
            return
        tensors, metadata = safetensors_io.read_file(os.path.join(directory,
                                                                  "reference.safetensors"))
        written_loss = float(metadata["loss"])
        check(abs(written_loss - loss) <= 1e-12 * abs(loss) and repr(written_loss) in result.stdout,
              f"{family}: metadata and stdout carry the loss {written_loss!r}")
        expected = ref.parameter_shapes(cfg)
        check(sorted(tensors) == sorted(name for name, _ in expected),
              f"{family}: reference.safetensors holds the gradient of every parameter")
        worst = 0.0
        for name, shape in expected:
            dtype, stored_shape, values = tensors[name]
            if dtype != "F32" or stored_shape != shape:
                check(False, f"{family}: gradient {name} is {dtype} {stored_shape}")
                continue
            stored = torch.tensor(values, dtype=torch.float64).view(shape)
            scale = grads[name].abs().max().item() + 1e-30
            worst = max(worst, (stored - grads[name]).abs().max().item() / scale)
        check(worst < 1e-6, f"{family}: stored gradients are the F32 rounding of autograd's "
                            f"(worst relative difference {worst:.1e})")

        # Broken inputs fail with a message, not a traceback.
        bad_cfg = dict(cfg, d_ff=cfg["d_ff"] + 1)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(bad_cfg, f)
        result = run([directory])
        check(result.returncode == 1 and "has shape" in result.stderr
              and "Traceback" not in result.stderr,
              f"{family}: a weight shape mismatch is reported: {result.stderr.strip()}")
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(directory, "batch.json"), "w") as f:
            json.dump({"inputs": [[cfg["vocab_size"]]], "targets": [[0]]}, f)
        result = run([directory])
        check(result.returncode == 1 and "token ids" in result.stderr,
              f"{family}: an out-of-range token id is reported: {result.stderr.strip()}")


def check_hf_mode(extra_args, tied):
    label = " ".join(extra_args) or "single file"
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "hf")
        result = run(["--hf-checkpoint", out, "--seed", "3", "--layers", "2", "--d-model", "32",
                      "--heads", "4", "--kv-heads", "2", "--d-ff", "48", "--vocab", "40",
                      "--max-seq-len", "16", "--seq-len", "10", "--batch", "2"] + extra_args)
        check(result.returncode == 0, f"--hf-checkpoint ({label}) exits 0 {result.stderr.strip()}")
        if result.returncode != 0:
            return
        with open(os.path.join(out, "config.json")) as f:
            hf = json.load(f)
        check(hf["architectures"] == ["LlamaForCausalLM"] and hf["tie_word_embeddings"] == tied
              and hf["num_key_value_heads"] == 2 and hf["intermediate_size"] == 48,
              f"--hf-checkpoint ({label}): config.json describes the model")
        index_path = os.path.join(out, "model.safetensors.index.json")
        sharded = os.path.exists(index_path)
        if sharded:
            with open(index_path) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        tensors = {}
        for file in files:
            tensors.update(safetensors_io.read_file(os.path.join(out, file))[0])
        cfg = ref.config_from_hf(hf)
        names = [name for name, _ in ref.parameter_shapes(cfg)
                 if not (tied and name == "lm_head.weight")]
        check(sorted(tensors) == sorted(names) and len(files) == (3 if sharded else 1)
              and all(dtype == "BF16" for dtype, _, _ in tensors.values()),
              f"--hf-checkpoint ({label}): {len(files)} file(s) hold every tensor as BF16")
        params = {name: torch.tensor(values, dtype=torch.float64).view(shape)
                  for name, (_, shape, values) in tensors.items()}
        with open(os.path.join(out, "batch.json")) as f:
            inputs, targets = ref.validate_batch(json.load(f), cfg)
        with open(os.path.join(out, "expected_loss.json")) as f:
            expected = json.load(f)["loss"]
        with torch.no_grad():
            loss = independent_llama_loss(params, cfg, inputs, targets, tied=tied).item()
        check(abs(loss - expected) <= 1e-12 * abs(loss),
              f"--hf-checkpoint ({label}): expected_loss {expected!r} equals the independent "
              f"formulation on the stored bf16 weights ({loss!r})")
        # The loss must depend on the rounding: unrounded float32 weights give another one.
        unrounded = {name: t.double() for name, t in
                     ref.random_parameters(ref.config_from_hf(hf), 3).items()}
        with torch.no_grad():
            loss_f32 = independent_llama_loss(unrounded, cfg, inputs, targets, tied=tied).item()
        check(abs(loss_f32 - expected) > 1e-9,
              f"--hf-checkpoint ({label}): the bf16 rounding is visible in the loss "
              f"({loss_f32 - expected:.1e})")


def main():
    torch.set_num_threads(1)
    check_attention()
    for family in ("llama", "gpt2"):
        check_finite_differences(family)
        check_sensitivity(family, *check_independent_forward(family))
        check_directory_mode(family)
    check_hf_mode([], tied=False)
    check_hf_mode(["--shards", "3", "--tied"], tied=True)
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall reference checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
