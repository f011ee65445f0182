#!/usr/bin/python3
"""Independent PyTorch reference for the ulysses trainer: loss and every parameter gradient.

    /usr/bin/python3 tests/reference/reference_model.py DIR
        reads DIR/config.json, DIR/weights.safetensors, DIR/batch.json and writes
        DIR/reference.safetensors (the gradient of every parameter, F32, same names) with
        metadata {"loss": repr(float64 loss)}; prints the loss.

    /usr/bin/python3 tests/reference/reference_model.py --hf-checkpoint OUT_DIR --seed S [...]
        writes a tiny Hugging Face Llama checkpoint (config.json, BF16 model.safetensors) from
        random weights, plus batch.json and expected_loss.json (the loss of this file's
        forward on the bf16-rounded weights).

    /usr/bin/python3 tests/reference/reference_model.py --greedy HF_DIR --prompt-tokens 1,2,3 \
            --new-tokens N
        prints the greedy continuation of the prompt by a Hugging Face Llama checkpoint
        (the argmax token, appended and fed back, N times) and the smallest gap between the
        two largest logits on the way.

Everything runs in float64 on the CPU with PyTorch 1.13; safetensors are read and written
with the pure-python safetensors_io module next to this file. See README.md.
"""

import argparse
import json
import math
import os
import sys
from array import array

import torch

import safetensors_io

CONFIG_KEYS = ("family", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size",
               "max_seq_len", "rope_theta", "norm_eps")


class ReferenceError(Exception):
    pass


# ----------------------------------------------------------------------------- config / data

def validate_config(cfg, source="config"):
    """Checks a config dict (keys of CONFIG_KEYS) and returns a normalised copy."""
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ReferenceError(f"{source}: missing keys {missing}")
    cfg = {k: cfg[k] for k in CONFIG_KEYS}
    if cfg["family"] not in ("llama", "gpt2"):
        raise ReferenceError(f"{source}: family must be llama or gpt2, not {cfg['family']!r}")
    for key in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size",
                "max_seq_len"):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < 0:
            raise ReferenceError(f"{source}: {key} must be a non-negative integer")
    if cfg["n_kv_heads"] == 0:  # the trainer's convention: 0 = n_heads
        cfg["n_kv_heads"] = cfg["n_heads"]
    for key in ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "max_seq_len"):
        if cfg[key] == 0:
            raise ReferenceError(f"{source}: {key} must be the resolved, positive value")
    for key in ("rope_theta", "norm_eps"):
        if not isinstance(cfg[key], (int, float)) or cfg[key] <= 0:
            raise ReferenceError(f"{source}: {key} must be a positive number")
    if cfg["d_model"] % cfg["n_heads"]:
        raise ReferenceError(f"{source}: d_model {cfg['d_model']} is not a multiple of "
                             f"n_heads {cfg['n_heads']}")
    if cfg["n_heads"] % cfg["n_kv_heads"]:
        raise ReferenceError(f"{source}: n_heads {cfg['n_heads']} is not a multiple of "
                             f"n_kv_heads {cfg['n_kv_heads']}")
    if cfg["family"] == "llama" and (cfg["d_model"] // cfg["n_heads"]) % 2:
        raise ReferenceError(f"{source}: RoPE needs an even head dim")
    if cfg["family"] == "gpt2" and cfg["n_kv_heads"] != cfg["n_heads"]:
        raise ReferenceError(f"{source}: gpt2 has no grouped-query attention "
                             f"(n_kv_heads must equal n_heads)")
    return cfg


def parameter_shapes(cfg):
    """[(name, shape)] of every parameter, in the order the outputs are written."""
    C, F, V, L = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"], cfg["n_layers"]
    d = C // cfg["n_heads"]
    if cfg["family"] == "llama":
        Hq, Hkv = cfg["n_heads"] * d, cfg["n_kv_heads"] * d
        shapes = [("model.embed_tokens.weight", [V, C])]
        for i in range(L):
            p = f"model.layers.{i}."
            shapes += [
                (p + "input_layernorm.weight", [C]),
                (p + "self_attn.q_proj.weight", [Hq, C]),
                (p + "self_attn.k_proj.weight", [Hkv, C]),
                (p + "self_attn.v_proj.weight", [Hkv, C]),
                (p + "self_attn.o_proj.weight", [C, Hq]),
                (p + "post_attention_layernorm.weight", [C]),
                (p + "mlp.gate_proj.weight", [F, C]),
                (p + "mlp.up_proj.weight", [F, C]),
                (p + "mlp.down_proj.weight", [C, F]),
            ]
        return shapes + [("model.norm.weight", [C]), ("lm_head.weight", [V, C])]
    shapes = [("transformer.wte.weight", [V, C]),
              ("transformer.wpe.weight", [cfg["max_seq_len"], C])]
    for i in range(L):
        p = f"transformer.h.{i}."
        shapes += [
            (p + "ln_1.weight", [C]), (p + "ln_1.bias", [C]),
            (p + "attn.c_attn.weight", [3 * C, C]), (p + "attn.c_attn.bias", [3 * C]),
            (p + "attn.c_proj.weight", [C, C]), (p + "attn.c_proj.bias", [C]),
            (p + "ln_2.weight", [C]), (p + "ln_2.bias", [C]),
            (p + "mlp.c_fc.weight", [F, C]), (p + "mlp.c_fc.bias", [F]),
            (p + "mlp.c_proj.weight", [C, F]), (p + "mlp.c_proj.bias", [C]),
        ]
    return shapes + [("transformer.ln_f.weight", [C]), ("transformer.ln_f.bias", [C])]


def tensors_to_params(tensors, cfg, source):
    """safetensors_io tensors -> {name: float64 leaf tensor}; every name, exact shapes."""
    expected = parameter_shapes(cfg)
    params = {}
    for name, shape in expected:
        if name not in tensors:
            raise ReferenceError(f"{source}: tensor '{name}' is missing")
        _, stored_shape, values = tensors[name]
        if list(stored_shape) != shape:
            raise ReferenceError(f"{source}: tensor '{name}' has shape {stored_shape}, "
                                 f"expected {shape}")
        params[name] = torch.tensor(values, dtype=torch.float32).reshape(shape).double()
    unexpected = sorted(set(tensors) - {name for name, _ in expected})
    if unexpected:
        raise ReferenceError(f"{source}: unexpected tensors {unexpected}")
    return params


def validate_document_starts(batch, shape, source):
    """Optional "document_starts": [[0, s1, ...], ...] per sequence (packed documents,
    docs/parallelism.md "Packed documents") -> document index of every token, int64 [B, T];
    None without documents."""
    if "document_starts" not in batch:
        return None
    starts = batch["document_starts"]
    B, T = shape
    if (not isinstance(starts, list) or len(starts) != B
            or not all(isinstance(r, list) and r and r[0] == 0 for r in starts)
            or not all(isinstance(s, int) and 0 <= s < T for r in starts for s in r)
            or not all(a < b for r in starts for a, b in zip(r, r[1:]))):
        raise ReferenceError(f"{source}: document_starts must hold one ascending list per "
                             f"sequence, starting at 0, of positions below {T}")
    documents = torch.zeros(B, T, dtype=torch.int64)
    for b, row in enumerate(starts):
        for s in row[1:]:
            documents[b, s:] += 1
    return documents


def document_positions(documents):
    """Each token's position inside its document, int64 [B, T]."""
    B, T = documents.shape
    positions = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for t in range(1, T):
            same = documents[b, t] == documents[b, t - 1]
            positions[b, t] = positions[b, t - 1] + 1 if same else 0
    return positions


def validate_batch(batch, cfg, source="batch"):
    """{"inputs": [[...]], "targets": [[...]]} -> (inputs, targets) as int64 [B, T]."""
    if not isinstance(batch, dict) or "inputs" not in batch or "targets" not in batch:
        raise ReferenceError(f"{source}: needs \"inputs\" and \"targets\"")
    rows = {}
    for key in ("inputs", "targets"):
        value = batch[key]
        if (not isinstance(value, list) or not value
                or not all(isinstance(r, list) and r for r in value)
                or not all(isinstance(t, int) and not isinstance(t, bool)
                           for r in value for t in r)):
            raise ReferenceError(f"{source}: {key} must be a non-empty list of non-empty "
                                 f"lists of integers")
        if len({len(r) for r in value}) != 1:
            raise ReferenceError(f"{source}: {key} rows differ in length")
        rows[key] = torch.tensor(value, dtype=torch.int64)
    inputs, targets = rows["inputs"], rows["targets"]
    if inputs.shape != targets.shape:
        raise ReferenceError(f"{source}: inputs {list(inputs.shape)} and targets "
                             f"{list(targets.shape)} differ in shape")
    V, T = cfg["vocab_size"], inputs.shape[1]
    if T > cfg["max_seq_len"]:
        raise ReferenceError(f"{source}: sequence length {T} exceeds max_seq_len "
                             f"{cfg['max_seq_len']}")
    if inputs.min() < 0 or inputs.max() >= V:
        raise ReferenceError(f"{source}: input token ids must be in [0, {V})")
    if targets.min() < -1 or targets.max() >= V:
        raise ReferenceError(f"{source}: targets must be -1 or in [0, {V})")
    if not (targets >= 0).any():
        raise ReferenceError(f"{source}: no counted targets (all are -1)")
    return inputs, targets


# ----------------------------------------------------------------------------- the models

def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def layer_norm(x, weight, bias, eps):
    mean = x.mean(dim=-1, keepdim=True)
    variance = (x - mean).pow(2).mean(dim=-1, keepdim=True)  # biased, as nn.LayerNorm
    return (x - mean) * torch.rsqrt(variance + eps) * weight + bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def silu(x):
    return x * torch.sigmoid(x)


def rope_cos_sin_at(positions, head_dim, theta):
    """cos, sin [B, 1, T, head_dim] for positions [B, T] (restarting per document)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = positions.to(torch.float64).unsqueeze(-1) * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


def rope_cos_sin(T, head_dim, theta):
    """cos, sin [T, head_dim] for positions 0..T-1, Hugging Face layout cat(freqs, freqs)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x [B, heads, T, d]."""
    return x * cos + rotate_half(x) * sin


def causal_attention(q, k, v, documents=None):
    """q [B, H, T, d], k and v [B, Hkv, T, d]; q head h reads kv head h // (H / Hkv).
    With documents [B, T] (document index of each token) the mask is block-diagonal causal:
    a query sees only the keys of its own document up to itself."""
    H, T, d = q.shape[1], q.shape[2], q.shape[3]
    group = H // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    if documents is not None:
        other = documents.unsqueeze(-1) != documents.unsqueeze(-2)  # [B, T, T]
        future = (future | other).unsqueeze(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def split_heads(x, n_heads):
    """[B, T, n·d] -> [B, n, T, d] (head h owns columns h·d .. h·d+d-1)."""
    B, T, _ = x.shape
    return x.view(B, T, n_heads, -1).transpose(1, 2)


def merge_heads(x):
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


def layer_params(params, prefix):
    """The tensors of one layer, keyed by their names without the layer prefix."""
    return {name[len(prefix):]: t for name, t in params.items() if name.startswith(prefix)}


def llama_logits(params, cfg, inputs, tied=False, documents=None):
    T = inputs.shape[1]
    H, Hkv, eps = cfg["n_heads"], cfg["n_kv_heads"], cfg["norm_eps"]
    if documents is None:
        cos, sin = rope_cos_sin(T, cfg["d_model"] // H, cfg["rope_theta"])
    else:
        cos, sin = rope_cos_sin_at(document_positions(documents), cfg["d_model"] // H,
                                   cfg["rope_theta"])
    x = params["model.embed_tokens.weight"][inputs]
    for i in range(cfg["n_layers"]):
        w = layer_params(params, f"model.layers.{i}.")
        h = rms_norm(x, w["input_layernorm.weight"], eps)
        q = apply_rope(split_heads(h @ w["self_attn.q_proj.weight"].T, H), cos, sin)
        k = apply_rope(split_heads(h @ w["self_attn.k_proj.weight"].T, Hkv), cos, sin)
        v = split_heads(h @ w["self_attn.v_proj.weight"].T, Hkv)
        y = causal_attention(q, k, v, documents)
        x = x + merge_heads(y) @ w["self_attn.o_proj.weight"].T
        h = rms_norm(x, w["post_attention_layernorm.weight"], eps)
        gated = silu(h @ w["mlp.gate_proj.weight"].T) * (h @ w["mlp.up_proj.weight"].T)
        x = x + gated @ w["mlp.down_proj.weight"].T
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = params["model.embed_tokens.weight" if tied else "lm_head.weight"]
    return x @ head.T


def gpt2_logits(params, cfg, inputs, documents=None):
    T = inputs.shape[1]
    C, H, eps = cfg["d_model"], cfg["n_heads"], cfg["norm_eps"]
    wte = params["transformer.wte.weight"]
    if documents is None:
        x = wte[inputs] + params["transformer.wpe.weight"][:T]
    else:
        x = wte[inputs] + params["transformer.wpe.weight"][document_positions(documents)]
    for i in range(cfg["n_layers"]):
        w = layer_params(params, f"transformer.h.{i}.")
        h = layer_norm(x, w["ln_1.weight"], w["ln_1.bias"], eps)
        q, k, v = (h @ w["attn.c_attn.weight"].T + w["attn.c_attn.bias"]).split(C, dim=-1)
        y = causal_attention(split_heads(q, H), split_heads(k, H), split_heads(v, H), documents)
        x = x + merge_heads(y) @ w["attn.c_proj.weight"].T + w["attn.c_proj.bias"]
        h = layer_norm(x, w["ln_2.weight"], w["ln_2.bias"], eps)
        h = gelu_tanh(h @ w["mlp.c_fc.weight"].T + w["mlp.c_fc.bias"])
        x = x + h @ w["mlp.c_proj.weight"].T + w["mlp.c_proj.bias"]
    x = layer_norm(x, params["transformer.ln_f.weight"], params["transformer.ln_f.bias"], eps)
    return x @ wte.T


def model_loss(params, cfg, inputs, targets, tied=False, documents=None):
    """Mean cross-entropy over the counted targets (target -1 is not counted)."""
    if cfg["family"] == "llama":
        logits = llama_logits(params, cfg, inputs, tied, documents)
    else:
        logits = gpt2_logits(params, cfg, inputs, documents)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, cfg["vocab_size"]), targets.reshape(-1), ignore_index=-1)


def loss_and_gradients(params, cfg, inputs, targets, documents=None):
    """(float loss, {name: float64 gradient}) via autograd."""
    leaves = {name: t.detach().clone().requires_grad_(True) for name, t in params.items()}
    loss = model_loss(leaves, cfg, inputs, targets, documents=documents)
    loss.backward()
    return loss.item(), {name: t.grad.detach() for name, t in leaves.items()}


# ----------------------------------------------------------------------------- mode: DIR

def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ReferenceError(f"cannot read {path}: {e}")


def flat_values(tensor):
    return array("f", tensor.float().reshape(-1).tolist())


def run_reference(directory):
    config_path = os.path.join(directory, "config.json")
    weights_path = os.path.join(directory, "weights.safetensors")
    batch_path = os.path.join(directory, "batch.json")
    cfg = validate_config(read_json(config_path), config_path)
    tensors, _ = safetensors_io.read_file(weights_path)
    params = tensors_to_params(tensors, cfg, weights_path)
    batch = read_json(batch_path)
    inputs, targets = validate_batch(batch, cfg, batch_path)
    documents = validate_document_starts(batch, tuple(inputs.shape), batch_path)

    loss, grads = loss_and_gradients(params, cfg, inputs, targets, documents)
    output = [(name, "F32", shape, flat_values(grads[name]))
              for name, shape in parameter_shapes(cfg)]
    metadata = {"loss": repr(loss), "counted_targets": str(int((targets >= 0).sum()))}
    safetensors_io.write_file(os.path.join(directory, "reference.safetensors"), output, metadata)
    print(f"loss {loss!r}")


# ----------------------------------------------------------------------------- mode: HF

def random_parameters(cfg, seed):
    """float32 weights large enough that attention, RoPE and norms visibly matter (unlike
    the usual std 0.02): embeddings of std 0.5, linear weights of std 1/sqrt(fan_in), norm
    gains around 1, biases around 0."""
    generator = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in parameter_shapes(cfg):
        if len(shape) == 1:
            base = 1.0 if name.endswith("weight") else 0.0
            t = base + 0.1 * torch.randn(shape, generator=generator)
        elif "embed_tokens" in name or ".wte." in name or ".wpe." in name:
            t = 0.5 * torch.randn(shape, generator=generator)
        else:
            t = torch.randn(shape, generator=generator) / math.sqrt(shape[1])
        params[name] = t
    return params


def random_batch(cfg, batch_size, seq_len, seed):
    """Random tokens; targets are the inputs shifted by one, all counted."""
    generator = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(cfg["vocab_size"], (batch_size, seq_len + 1), generator=generator)
    return {"inputs": tokens[:, :-1].tolist(), "targets": tokens[:, 1:].tolist()}


def hf_config(cfg, tied):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg["d_model"],
        "intermediate_size": cfg["d_ff"],
        "num_hidden_layers": cfg["n_layers"],
        "num_attention_heads": cfg["n_heads"],
        "num_key_value_heads": cfg["n_kv_heads"],
        "rms_norm_eps": cfg["norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "vocab_size": cfg["vocab_size"],
        "max_position_embeddings": cfg["max_seq_len"],
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    }


def config_from_hf(hf):
    keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta",
            "rms_norm_eps")
    missing = [key for key in keys if key not in hf]
    if missing:
        raise ReferenceError(f"Hugging Face config.json: missing keys {missing}")
    return validate_config({
        "family": "llama", "n_layers": hf["num_hidden_layers"], "d_model": hf["hidden_size"],
        "n_heads": hf["num_attention_heads"], "n_kv_heads": hf["num_key_value_heads"],
        "d_ff": hf["intermediate_size"], "vocab_size": hf["vocab_size"],
        "max_seq_len": hf["max_position_embeddings"], "rope_theta": hf["rope_theta"],
        "norm_eps": hf["rms_norm_eps"]}, "Hugging Face config.json")


def read_hf_checkpoint(directory):
    """(cfg, tied, {name: float64 tensor}) from a folder with config.json and either
    model.safetensors or model.safetensors.index.json plus its shards."""
    hf = read_json(os.path.join(directory, "config.json"))
    cfg = config_from_hf(hf)
    tied = bool(hf.get("tie_word_embeddings", False))
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ReferenceError(f"{index_path}: no weight_map object")
        files = sorted(set(weight_map.values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for file in files:
        tensors.update(safetensors_io.read_file(os.path.join(directory, file))[0])
    if tied and "model.embed_tokens.weight" in tensors:
        # Tied checkpoints store no lm_head; the reference model reads the embedding.
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    return cfg, tied, tensors_to_params(tensors, cfg, directory)


def write_hf_checkpoint(args):
    cfg = validate_config({
        "family": "llama", "n_layers": args.layers, "d_model": args.d_model,
        "n_heads": args.heads, "n_kv_heads": args.kv_heads, "d_ff": args.d_ff,
        "vocab_size": args.vocab, "max_seq_len": args.max_seq_len,
        "rope_theta": args.rope_theta, "norm_eps": args.norm_eps}, "arguments")
    if args.seq_len > cfg["max_seq_len"]:
        raise ReferenceError(f"--seq-len {args.seq_len} exceeds --max-seq-len {cfg['max_seq_len']}")
    if args.shards < 1:
        raise ReferenceError("--shards must be at least 1")
    out = args.hf_checkpoint
    os.makedirs(out, exist_ok=True)

    params = random_parameters(cfg, args.seed)
    names = [name for name, _ in parameter_shapes(cfg)
             if not (args.tied and name == "lm_head.weight")]
    tensors = [(name, "BF16", list(params[name].shape), flat_values(params[name]))
               for name in names]
    metadata = {"format": "pt"}
    if args.shards == 1:
        safetensors_io.write_file(os.path.join(out, "model.safetensors"), tensors, metadata)
    else:
        per_shard = math.ceil(len(tensors) / args.shards)
        weight_map = {}
        for s in range(args.shards):
            file = f"model-{s + 1:05d}-of-{args.shards:05d}.safetensors"
            chunk = tensors[s * per_shard:(s + 1) * per_shard]
            safetensors_io.write_file(os.path.join(out, file), chunk, metadata)
            weight_map.update({name: file for name, *_ in chunk})
        total_size = sum(2 * math.prod(shape) for _, _, shape, _ in tensors)
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f,
                      indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(cfg, args.tied), f, indent=2)

    batch = random_batch(cfg, args.batch, args.seq_len, args.seed)
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump(batch, f)

    # The expected loss comes from the files as written, so it sees exactly the
    # bf16-rounded weights an importer will read.
    cfg_back, tied, rounded = read_hf_checkpoint(out)
    inputs, targets = validate_batch(batch, cfg_back)
    with torch.no_grad():
        loss = model_loss(rounded, cfg_back, inputs, targets, tied).item()
    with open(os.path.join(out, "expected_loss.json"), "w") as f:
        json.dump({"loss": loss, "counted_targets": int((targets >= 0).sum()),
                   "note": "float64 forward on the bf16-rounded weights"}, f, indent=2)
    print(f"loss {loss!r}")


def greedy_continuation(args):
    """(new tokens, smallest top-1 minus top-2 logit gap) of a Hugging Face checkpoint."""
    cfg, tied, params = read_hf_checkpoint(args.greedy)
    try:
        tokens = [int(t) for t in args.prompt_tokens.split(",")]
    except ValueError:
        raise ReferenceError(f"--prompt-tokens {args.prompt_tokens!r}: not comma-separated ids")
    if not tokens or min(tokens) < 0 or max(tokens) >= cfg["vocab_size"]:
        raise ReferenceError(f"--prompt-tokens must be ids in [0, {cfg['vocab_size']})")
    if len(tokens) + args.new_tokens > cfg["max_seq_len"]:
        raise ReferenceError("the prompt and the new tokens exceed max_position_embeddings")
    new_tokens, smallest_gap = [], math.inf
    with torch.no_grad():
        for _ in range(args.new_tokens):
            logits = llama_logits(params, cfg, torch.tensor([tokens]), tied)[0, -1]
            top2 = torch.topk(logits, 2).values
            smallest_gap = min(smallest_gap, (top2[0] - top2[1]).item())
            token = int(torch.argmax(logits))
            new_tokens.append(token)
            tokens.append(token)
    return new_tokens, smallest_gap


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", nargs="?",
                        help="folder with config.json, weights.safetensors, batch.json")
    parser.add_argument("--hf-checkpoint", metavar="OUT_DIR",
                        help="write a tiny random Hugging Face Llama checkpoint here instead")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--d-ff", type=int, default=160)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--norm-eps", type=float, default=1e-5)
    parser.add_argument("--batch", type=int, default=2, help="sequences in batch.json")
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--shards", type=int, default=1,
                        help="split the weights over this many files with an index")
    parser.add_argument("--tied", action="store_true",
                        help="tie_word_embeddings=true: no lm_head tensor")
    parser.add_argument("--greedy", metavar="HF_DIR",
                        help="print the greedy continuation of --prompt-tokens by this checkpoint")
    parser.add_argument("--prompt-tokens", default="", help="--greedy: e.g. 1,2,3")
    parser.add_argument("--new-tokens", type=int, default=8, help="--greedy: tokens to generate")
    args = parser.parse_args(argv)
    if [args.dir, args.hf_checkpoint, args.greedy].count(None) != 2:
        parser.error("give one of DIR, --hf-checkpoint OUT_DIR or --greedy HF_DIR")
    try:
        if args.greedy:
            new_tokens, smallest_gap = greedy_continuation(args)
            print("tokens " + " ".join(str(t) for t in new_tokens))
            print(f"smallest_gap {smallest_gap!r}")
        elif args.hf_checkpoint:
            write_hf_checkpoint(args)
        else:
            run_reference(args.dir)
    except (ReferenceError, safetensors_io.SafetensorsError, OSError) as e:
        print(f"reference_model.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
