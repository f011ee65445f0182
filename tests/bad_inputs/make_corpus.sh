#!/usr/bin/env bash
# Regenerates the GENERATED part of the bad-input corpus (issue #12, item 7) from scratch:
#
#   tokens/       llm.c token shards, valid and broken            (written by the Python below)
#   checkpoints/  ulysses checkpoints: good ones made by the binary, corrupt copies of them
#   hf/           Hugging Face Llama folders: one exported by the binary, corrupt copies
#                 (including the malformed-safetensors cases, as hf/st-*/model.safetensors)
#   llmc/         llm.c GPT-2 checkpoint files: one exported by the binary, corrupt copies
#
# HAND-WRITTEN (not touched by this script): configs/*.yaml, text/*.txt, cases.tsv,
# run_cases.sh, README.md and this script.
#
# Usage: tests/bad_inputs/make_corpus.sh [path/to/ulysses-train]
# (default: build/apps/ulysses-train of this repository). Needs python3 (standard library
# only). The valid base artefacts are made by a tiny run of the binary (configs/tiny.yaml
# and configs/tiny-gpt2.yaml, 2 steps, 856 / 1112 parameters) and by `ulysses-train export`;
# every broken file is a copy of one of them with one deliberate defect, described next to
# the line that makes it. A defect inside a checkpoint that the manifest would otherwise
# catch is followed by recrc(), which rewrites manifest.json's byte sizes and CRC-32s, so
# that the case reaches the check it is meant for.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TRAIN=$(realpath "${1:-$HERE/../../build/apps/ulysses-train}")
[[ -x $TRAIN ]] || { echo "make_corpus.sh: no ulysses-train binary at $TRAIN" >&2; exit 2; }
cd "$HERE"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1

run() {  # quiet unless it fails
  if ! "$@" >"$WORK/log" 2>&1; then cat "$WORK/log" >&2; echo "make_corpus.sh: failed: $*" >&2; exit 1; fi
}

# ---- valid base artefacts, made by the binary ----------------------------------------------
run "$TRAIN" -c configs/tiny.yaml --set "train.checkpoint.dir=$WORK/llama"
run "$TRAIN" -c configs/tiny.yaml --set "train.checkpoint.dir=$WORK/two" --set train.checkpoint.every=1
run "$TRAIN" -c configs/tiny-gpt2.yaml --set "train.checkpoint.dir=$WORK/gpt2"
run "$TRAIN" export --checkpoint "$WORK/llama" --format hf-llama --out "$WORK/hf"
run "$TRAIN" export --checkpoint "$WORK/gpt2" --format llmc --out "$WORK/gpt2.bin"

rm -rf tokens checkpoints hf llmc

# ---- copies with one defect each ---------------------------------------------------------------
python3 - "$WORK" <<'PY'
import json, os, shutil, struct, sys, zlib

work = sys.argv[1]

def rd(path):
    with open(path, "rb") as f:
        return f.read()

def wr(path, data):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)

def rjson(path):
    with open(path) as f:
        return json.load(f)

def wjson(path, obj):
    wr(path, (json.dumps(obj, indent=2) + "\n").encode())

# safetensors: u64 little-endian header length N, N bytes of JSON, then the data.
def st_parse(data):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]

def st_build(header, payload, header_text=None, length=None):
    text = header_text if header_text is not None else json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + payload

def st_edit(path, edit):
    header, payload = st_parse(rd(path))
    payload = edit(header, payload) or payload
    wr(path, st_build(header, payload))

def recrc(folder):
    """Rewrites manifest.json's sizes and CRC-32s after a deliberate edit."""
    manifest = rjson(folder + "/manifest.json")
    for name, entry in manifest["files"].items():
        path = folder + "/" + name
        if os.path.isfile(path):
            data = rd(path)
            entry["bytes"] = len(data)
            entry["crc32"] = zlib.crc32(data) & 0xFFFFFFFF
    wjson(folder + "/manifest.json", manifest)

# ---- tokens/: llm.c token shards (vocabulary 64 in configs/tiny-tokens.yaml) --------------------
# 256 int32 header [magic 20240520, version, count, 0...], then count tokens of 2 (v1) or 4 (v2)
# bytes; the file must be exactly 1024 + width * count bytes.
def shard(path, tokens, version=1, magic=20240520, count=None, cut=0, extra=b""):
    header = [0] * 256
    header[0], header[1] = magic, version
    header[2] = len(tokens) if count is None else count
    width = 2 if version == 1 else 4
    body = b"".join(struct.pack("<H" if width == 2 else "<I", t) for t in tokens)
    data = struct.pack("<256i", *header) + body + extra
    wr(path, data[:len(data) - cut] if cut else data)

good = [(7 * i + 3) % 64 for i in range(200)]
shard("tokens/good-v1.bin", good)                           # valid, uint16
shard("tokens/good-v2.bin", good, version=2)                # valid, uint32
shard("tokens/bad-magic.bin", good, magic=20240326)         # llm.c *model* magic, not a shard
shard("tokens/version-3.bin", good, version=3)              # no such version
shard("tokens/truncated.bin", good, cut=100)                # header says 200, file holds 150
shard("tokens/oversized.bin", good, count=150)              # header says 150, file holds 200
shard("tokens/count-huge.bin", good, count=2**31 - 1)       # count INT32_MAX, 200 tokens present
shard("tokens/negative-count.bin", [], count=-5)            # count -5
shard("tokens/zero-tokens.bin", [])                         # valid header, no tokens at all
wr("tokens/short-header.bin", rd("tokens/good-v1.bin")[:100])  # shorter than the header
wr("tokens/empty.bin", b"")                                 # 0 bytes
# Exactly one 16-token sequence (17 tokens), so the first step reads the bad token.
one = [(5 * i + 1) % 64 for i in range(17)]
shard("tokens/token-too-big.bin", one[:9] + [1000] + one[10:])                 # 1000 >= 64 at 9
shard("tokens/token-too-big-v2.bin", one[:3] + [0xFFFFFFFF] + one[4:], version=2)  # 2^32-1 at 3

# ---- checkpoints/ ------------------------------------------------------------------------------
shutil.copytree(work + "/llama", "checkpoints/good")      # latest + step_00000002 (tiny.yaml)
shutil.copytree(work + "/two", "checkpoints/two-steps")   # latest + step_00000001, step_00000002
shutil.copytree(work + "/gpt2", "checkpoints/gpt2")       # latest + step_00000002 (tiny-gpt2.yaml)
GOOD = "checkpoints/good/step_00000002"

def step_copy(name, edit, fix_manifest=True):
    folder = "checkpoints/" + name
    shutil.copytree(GOOD, folder)
    edit(folder)
    if fix_manifest:
        recrc(folder)

def state_edit(change):
    def edit(folder):
        state = rjson(folder + "/trainer_state.json")
        change(state)
        wjson(folder + "/trainer_state.json", state)
    return edit

def flip_byte(path, offset_from_end=10):
    data = bytearray(rd(path))
    data[-offset_from_end] ^= 0xFF
    wr(path, bytes(data))

def truncate(path, keep):
    wr(path, rd(path)[:keep])

# trainer_state.json defects (manifest fixed up, so the state itself is what fails)
step_copy("state-no-model", state_edit(lambda s: s.pop("model")))
step_copy("state-no-optimizer-shards", state_edit(lambda s: s.pop("optimizer_shards")))
step_copy("state-negative-step", state_edit(lambda s: s.update(step=-1)))
step_copy("state-step-huge", state_edit(lambda s: s.update(step=2**64 - 1)))
step_copy("state-format-version-2", state_edit(lambda s: s.update(format_version=2)))
step_copy("state-size-string", state_edit(lambda s: s["model"].update(d_model="8")))
step_copy("state-shard-traversal",
          state_edit(lambda s: s.update(optimizer_shards=["../optimizer-00000-of-00001.safetensors"])))
step_copy("state-shard-absent",
          state_edit(lambda s: s.update(optimizer_shards=["optimizer-00000-of-00004.safetensors"])))
step_copy("state-shard-is-model",          # the weights file listed as an optimizer shard
          state_edit(lambda s: s.update(optimizer_shards=["model.safetensors"])))
step_copy("state-shard-duplicate",         # the one shard listed twice
          state_edit(lambda s: s.update(optimizer_shards=["optimizer-00000-of-00001.safetensors"] * 2)))
# model sizes no run could have (export rebuilds the model from these alone)
step_copy("state-model-huge", state_edit(lambda s: s["model"].update(
    d_model=2**31 - 1, n_heads=1, n_kv_heads=1, vocab_size=2**31 - 1)))
step_copy("state-layers-huge", state_edit(lambda s: s["model"].update(n_layers=2**31 - 1)))
step_copy("state-kv-heads-3", state_edit(lambda s: s["model"].update(n_kv_heads=3)))  # 3 does not divide 2 heads
step_copy("state-not-json",
          lambda f: wr(f + "/trainer_state.json", b'{"format_version": 1, "step": 2, "model": {\n'))

# manifest.json defects
step_copy("manifest-crc", lambda f: flip_byte(f + "/model.safetensors"), fix_manifest=False)
step_copy("manifest-not-json", lambda f: wr(f + "/manifest.json", b"format: ulysses-checkpoint\n"),
          fix_manifest=False)
step_copy("manifest-missing", lambda f: os.remove(f + "/manifest.json"), fix_manifest=False)

def manifest_traversal(folder):
    manifest = rjson(folder + "/manifest.json")
    manifest["files"]["../model.safetensors"] = manifest["files"].pop("model.safetensors")
    wjson(folder + "/manifest.json", manifest)
step_copy("manifest-traversal", manifest_traversal, fix_manifest=False)

def manifest_wrong_format(folder):
    manifest = rjson(folder + "/manifest.json")
    manifest["format"] = "safetensors-index"
    wjson(folder + "/manifest.json", manifest)
step_copy("manifest-wrong-format", manifest_wrong_format, fix_manifest=False)

# model.safetensors defects
step_copy("model-truncated", lambda f: truncate(f + "/model.safetensors", 2000), fix_manifest=False)
step_copy("model-truncated-recrc", lambda f: truncate(f + "/model.safetensors", 2000))
step_copy("model-missing", lambda f: os.remove(f + "/model.safetensors"), fix_manifest=False)

def wrong_shape(header, payload):
    header["model.embed_tokens.weight"]["shape"] = [8, 12]  # same bytes, transposed
step_copy("model-wrong-shape", lambda f: st_edit(f + "/model.safetensors", wrong_shape))

def renamed_tensor(header, payload):
    header["lm_head.weights"] = header.pop("lm_head.weight")
step_copy("model-missing-tensor", lambda f: st_edit(f + "/model.safetensors", renamed_tensor))

# optimizer-*.safetensors defects
OPT = "/optimizer-00000-of-00001.safetensors"
def bad_ranges(header, payload):
    header["__metadata__"]["ranges"] = "[[0, 99999]]"  # past the 856 parameters
step_copy("optimizer-bad-ranges", lambda f: st_edit(f + OPT, bad_ranges))

def half_ranges(header, payload):
    # A consistent file that holds the moments of only the first 428 of 856 parameters.
    half = 428
    header["__metadata__"]["ranges"] = "[[0, %d]]" % half
    a0, a1 = header["exp_avg"]["data_offsets"]
    b0, b1 = header["exp_avg_sq"]["data_offsets"]
    header["exp_avg"] = {"dtype": "F32", "shape": [half], "data_offsets": [0, 4 * half]}
    header["exp_avg_sq"] = {"dtype": "F32", "shape": [half], "data_offsets": [4 * half, 8 * half]}
    return payload[a0:a0 + 4 * half] + payload[b0:b0 + 4 * half]
def begin_not_number(header, payload):
    # The pre-ZeRO form of the metadata (begin/end instead of ranges), with a bad begin.
    header["__metadata__"].pop("ranges")
    header["__metadata__"].update(begin="abc", end="856")
step_copy("optimizer-begin-not-number", lambda f: st_edit(f + OPT, begin_not_number))

step_copy("optimizer-half", lambda f: st_edit(f + OPT, half_ranges))

# checkpoint dirs whose `latest` is unusable
def dir_with(name, latest, step_folder=True, broken=False):
    root = "checkpoints/" + name
    os.makedirs(root)
    if step_folder:
        shutil.copytree(GOOD, root + "/step_00000002")
        if broken:
            flip_byte(root + "/step_00000002/model.safetensors")
    wr(root + "/latest", latest)

dir_with("latest-traversal", b"../good/step_00000002\n")                     # + a good step
dir_with("latest-traversal-only", b"../good/step_00000002\n", step_folder=False)
dir_with("latest-dangling", b"step_00000009\n")                              # + a good step
dir_with("all-broken", b"step_00000002\n", broken=True)                      # CRC fails

# ---- hf/: Hugging Face Llama folders (config.json + model.safetensors) ----------------------------
HF = work + "/hf"
shutil.copytree(HF, "hf/good")

def hf_copy(name, config_edit=None, weights=None, files=None):
    folder = "hf/" + name
    os.makedirs(folder)
    config = rjson(HF + "/config.json")
    if config_edit:
        config_edit(config)
    wjson(folder + "/config.json", config)
    if weights is not None:
        wr(folder + "/model.safetensors", weights)
    for file_name, data in (files or {}).items():
        wr(folder + "/" + file_name, data)

GOOD_ST = rd(HF + "/model.safetensors")

def st_variant(edit):
    header, payload = st_parse(GOOD_ST)
    payload = edit(header, payload) or payload
    return st_build(header, payload)

hf_copy("wrong-hidden-size", lambda c: c.update(hidden_size=16), GOOD_ST)
hf_copy("rope-scaling", lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0}), GOOD_ST)
hf_copy("norm-eps", lambda c: c.update(rms_norm_eps=1e-6), GOOD_ST)
hf_copy("no-weights")                                       # config.json only
hf_copy("config-not-json", weights=GOOD_ST)
wr("hf/config-not-json/config.json", b"{hidden_size: 8, num_hidden_layers: 1\n")
hf_copy("missing-tensor", weights=st_variant(lambda h, p: h.pop("lm_head.weight") and None))
hf_copy("wrong-shape", weights=st_variant(
    lambda h, p: h["model.layers.0.mlp.up_proj.weight"].update(shape=[8, 16])))
names = [n for n in st_parse(GOOD_ST)[0] if n != "__metadata__"]
hf_copy("index-traversal", weights=GOOD_ST, files={
    "model.safetensors.index.json": (json.dumps(
        {"metadata": {}, "weight_map": {n: "../good/model.safetensors" for n in names}},
        indent=2) + "\n").encode()})
hf_copy("index-missing-shard", files={
    "model.safetensors.index.json": (json.dumps(
        {"metadata": {}, "weight_map": {n: "model-00001-of-00002.safetensors" for n in names}},
        indent=2) + "\n").encode()})

# malformed safetensors files, each in an otherwise good folder
header0, payload0 = st_parse(GOOD_ST)
hf_copy("st-empty", weights=b"")
hf_copy("st-header-too-long", weights=st_build(header0, payload0, length=len(GOOD_ST) + 100))
hf_copy("st-header-length-huge", weights=st_build(header0, payload0, length=2**64 - 1))
hf_copy("st-bad-json", weights=st_build(None, payload0,
        header_text=b'{"model.embed_tokens.weight":{"dtype":"F32","shape":[12,8],'))
hf_copy("st-header-not-object", weights=st_build(None, payload0, header_text=b"[1, 2, 3]"))
hf_copy("st-offsets-out-of-range", weights=st_variant(lambda h, p: h["lm_head.weight"].update(
    data_offsets=[x + 4096 for x in h["lm_head.weight"]["data_offsets"]])))
hf_copy("st-overlap", weights=st_variant(lambda h, p: h["model.layers.0.self_attn.k_proj.weight"].update(
    data_offsets=h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"])))
hf_copy("st-unknown-dtype", weights=st_variant(
    lambda h, p: h["model.embed_tokens.weight"].update(dtype="Q4")))
hf_copy("st-size-mismatch", weights=st_variant(
    lambda h, p: h["model.embed_tokens.weight"].update(data_offsets=[0, 380])))
hf_copy("st-negative-dim", weights=st_variant(
    lambda h, p: h["model.embed_tokens.weight"].update(shape=[-12, 8])))
hf_copy("st-huge-shape", weights=st_variant(
    lambda h, p: h["model.embed_tokens.weight"].update(shape=[2**32, 2**32, 2**32])))
hf_copy("st-bad-metadata", weights=st_variant(lambda h, p: h.update({"__metadata__": {"format": 1}})))

# ---- llmc/: llm.c GPT-2 checkpoint files ------------------------------------------------------------
# 256 int32 header [20240326, 3, maxT, V, L, NH, C, Vp, 0...], then the fp32 parameters.
LLMC = rd(work + "/gpt2.bin")

def llmc_header(**changes):
    header = list(struct.unpack("<256i", LLMC[:1024]))
    slots = dict(magic=0, version=1, maxT=2, V=3, L=4, NH=5, C=6, Vp=7)
    for key, value in changes.items():
        header[slots[key]] = value
    return struct.pack("<256i", *header) + LLMC[1024:]

wr("llmc/good.bin", LLMC)
wr("llmc/bad-magic.bin", llmc_header(magic=20240520))     # a token shard's magic
wr("llmc/version-5.bin", llmc_header(version=5))          # llm.c's bf16 format
wr("llmc/truncated.bin", LLMC[:-100])
wr("llmc/short-header.bin", LLMC[:512])
wr("llmc/trailing-bytes.bin", LLMC + bytes(16))
wr("llmc/header-c-16.bin", llmc_header(C=16))             # config has d_model 8
wr("llmc/vp-below-v.bin", llmc_header(Vp=8))              # V is 12
wr("llmc/vp-huge.bin", llmc_header(Vp=2**31 - 1))
PY

echo "make_corpus.sh: regenerated tokens/ checkpoints/ hf/ llmc/ ($(find tokens checkpoints hf llmc -type f | wc -l) files)"
