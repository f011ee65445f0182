#include "core/model/params.h"

#include <algorithm>
#include <stdexcept>

namespace ulysses {

namespace {

constexpr int kRoles = int(ParamRole::count);

// The tensor names of a family's weight files (Hugging Face Llama's, GPT-2's): a layer's
// tensor is layer_prefix + layer + "." + stem + ".weight" or ".bias". Which tensors exist
// follows the architecture (core/config/config.h); q, k and v are one stacked tensor in GPT-2.
struct ParamNames {
  std::string token_embedding, position_embedding, layer_prefix;
  std::string attn_norm;
  bool fused_qkv = false;  // one tensor named qkv, else q, k and v
  std::string q, k, v, qkv, o;
  std::string mlp_norm, gate, up, down;
  std::string final_norm, lm_head;
};

const ParamNames& param_names(Family family) {
  static const ParamNames kLlama = {.token_embedding = "model.embed_tokens.weight",
                                    .layer_prefix = "model.layers.",
                                    .attn_norm = "input_layernorm",
                                    .q = "self_attn.q_proj",
                                    .k = "self_attn.k_proj",
                                    .v = "self_attn.v_proj",
                                    .o = "self_attn.o_proj",
                                    .mlp_norm = "post_attention_layernorm",
                                    .gate = "mlp.gate_proj",
                                    .up = "mlp.up_proj",
                                    .down = "mlp.down_proj",
                                    .final_norm = "model.norm",
                                    .lm_head = "lm_head.weight"};
  static const ParamNames kGpt2 = {.token_embedding = "transformer.wte.weight",
                                   .position_embedding = "transformer.wpe.weight",
                                   .layer_prefix = "transformer.h.",
                                   .attn_norm = "ln_1",
                                   .fused_qkv = true,
                                   .qkv = "attn.c_attn",
                                   .o = "attn.c_proj",
                                   .mlp_norm = "ln_2",
                                   .up = "mlp.c_fc",
                                   .down = "mlp.c_proj",
                                   .final_norm = "transformer.ln_f"};
  switch (family) {
    case Family::llama:
      return kLlama;
    case Family::gpt2:
      return kGpt2;
  }
  throw std::logic_error("model family " + std::to_string(int(family)) + " has no tensor names");
}

}  // namespace

ParamTable::ParamTable(const ModelConfig& model)
    : index_(size_t(model.n_layers + 1) * kRoles, -1), n_layers_(model.n_layers) {
  const int64_t C = model.d_model, V = model.vocab_size, F = model.d_ff;
  const int64_t head_dim = model.head_dim();
  const int64_t q_width = int64_t(model.n_heads) * head_dim;
  const int64_t kv_width = int64_t(model.n_kv_heads) * head_dim;
  using Init = ParamSpec::Init;
  using R = ParamRole;

  const Architecture& arch = architecture(model.family);
  const ParamNames& names = param_names(model.family);
  const bool norm_bias = arch.norm == NormKind::layer;
  // Each tensor in the order of the family's weight files, which fixes the flat layout that
  // checkpoints and ZeRO shards store (docs/checkpoints.md).
  add(R::token_embedding, -1, names.token_embedding, {V, C}, Init::normal);
  if (arch.positions == PositionKind::learned)
    add(R::position_embedding, -1, names.position_embedding, {int64_t(model.max_seq_len), C},
        Init::normal);
  for (int i = 0; i < model.n_layers; ++i) {
    auto name = [&](const std::string& stem, const char* kind) {
      return names.layer_prefix + std::to_string(i) + "." + stem + "." + kind;
    };
    add(R::attn_norm_weight, i, name(names.attn_norm, "weight"), {C}, Init::ones);
    if (norm_bias) add(R::attn_norm_bias, i, name(names.attn_norm, "bias"), {C}, Init::zeros);
    if (names.fused_qkv) {
      // Stacked by rows; a fused family has no grouped-query attention, so each is C wide.
      add(R::qkv_weight, i, name(names.qkv, "weight"), {3 * C, C}, Init::normal);
      if (arch.biases) add(R::qkv_bias, i, name(names.qkv, "bias"), {3 * C}, Init::zeros);
    } else {
      add(R::q_weight, i, name(names.q, "weight"), {q_width, C}, Init::normal);
      add(R::k_weight, i, name(names.k, "weight"), {kv_width, C}, Init::normal);
      add(R::v_weight, i, name(names.v, "weight"), {kv_width, C}, Init::normal);
    }
    add(R::o_weight, i, name(names.o, "weight"), {C, q_width}, Init::residual_normal);
    if (arch.biases) add(R::o_bias, i, name(names.o, "bias"), {C}, Init::zeros);
    add(R::mlp_norm_weight, i, name(names.mlp_norm, "weight"), {C}, Init::ones);
    if (norm_bias) add(R::mlp_norm_bias, i, name(names.mlp_norm, "bias"), {C}, Init::zeros);
    if (arch.mlp == MlpKind::swiglu)
      add(R::gate_weight, i, name(names.gate, "weight"), {F, C}, Init::normal);
    add(R::up_weight, i, name(names.up, "weight"), {F, C}, Init::normal);
    if (arch.biases) add(R::up_bias, i, name(names.up, "bias"), {F}, Init::zeros);
    add(R::down_weight, i, name(names.down, "weight"), {C, F}, Init::residual_normal);
    if (arch.biases) add(R::down_bias, i, name(names.down, "bias"), {C}, Init::zeros);
  }
  add(R::final_norm_weight, -1, names.final_norm + ".weight", {C}, Init::ones);
  if (norm_bias) add(R::final_norm_bias, -1, names.final_norm + ".bias", {C}, Init::zeros);
  if (!arch.tied_head) add(R::lm_head, -1, names.lm_head, {V, C}, Init::normal);
}

void ParamTable::add(ParamRole role, int layer, std::string name, std::vector<int64_t> shape,
                     ParamSpec::Init init) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  bool decay = shape.size() >= 2;  // as nanoGPT: matrices and embeddings decay
  index_[size_t(layer + 1) * kRoles + int(role)] = int(specs_.size());
  specs_.push_back(
      ParamSpec{std::move(name), role, layer, std::move(shape), total_numel_, numel, decay, init});
  total_numel_ += numel;
}

bool ParamTable::has(ParamRole role) const {
  for (int layer = -1; layer < n_layers_; ++layer)
    if (index_[size_t(layer + 1) * kRoles + int(role)] >= 0) return true;
  return false;
}

const ParamSpec& ParamTable::find(ParamRole role, int layer) const {
  if (layer < -1 || layer >= n_layers_) throw std::out_of_range("layer index out of range");
  int index = index_[size_t(layer + 1) * kRoles + int(role)];
  if (index < 0)
    throw std::logic_error("parameter role " + std::to_string(int(role)) + " missing in layer " +
                           std::to_string(layer));
  return specs_[index];
}

const ParamSpec* ParamTable::find_by_name(const std::string& name) const {
  for (const ParamSpec& spec : specs_)
    if (spec.name == name) return &spec;
  return nullptr;
}

std::pair<int64_t, int64_t> ParamTable::layer_range(int layer) const {
  int64_t begin = -1, end = -1;
  for (const ParamSpec& spec : specs_) {
    if (spec.layer != layer) continue;
    if (begin < 0) begin = spec.offset;
    end = spec.offset + spec.numel;
  }
  return {begin, end};
}

Tensor ParamTable::view(const Tensor& window, int64_t window_begin, const ParamSpec& spec) const {
  if (spec.offset < window_begin || spec.offset + spec.numel > window_begin + window.numel())
    throw std::logic_error("parameter " + spec.name + " lies outside the window of elements [" +
                           std::to_string(window_begin) + ", " +
                           std::to_string(window_begin + window.numel()) + ")");
  Tensor whole = window.flat_range(spec.offset - window_begin, spec.numel);
  if (spec.shape.size() == 1) return whole;
  return whole.reshape({spec.shape[0], spec.shape[1]});
}

void for_each_tensor_piece(const ParamTable& table, int64_t begin, int64_t count,
                           const std::function<void(const ParamSpec& spec, int64_t first, int64_t n,
                                                    int64_t done)>& piece) {
  if (begin < 0 || count < 0 || begin + count > table.total_numel())
    throw std::out_of_range("parameter elements [" + std::to_string(begin) + ", " +
                            std::to_string(begin + count) + ") asked for; the table has " +
                            std::to_string(table.total_numel()));
  const std::vector<ParamSpec>& specs = table.specs();
  // The first tensor that ends after begin.
  auto spec = std::upper_bound(
      specs.begin(), specs.end(), begin,
      [](int64_t element, const ParamSpec& s) { return element < s.offset + s.numel; });
  for (int64_t done = 0; done < count; ++spec) {
    const int64_t first = begin + done - spec->offset;
    const int64_t n = std::min(count - done, spec->numel - first);
    if (n <= 0) continue;  // an empty tensor
    piece(*spec, first, n, done);
    done += n;
  }
}

std::vector<int64_t> shard_unit_ends(const ParamTable& table, int64_t bucket_elements) {
  std::vector<int64_t> ends;
  int64_t unit_begin = 0;
  const std::vector<ParamSpec>& specs = table.specs();
  for (size_t i = 1; i < specs.size(); ++i) {
    const int layer = specs[i].layer, previous = specs[i - 1].layer;
    if (layer == previous) continue;
    // Layer boundaries are cut unless the next layer still fits in the unit's bucket.
    if (layer >= 0 && previous >= 0 &&
        table.layer_range(layer).second - unit_begin <= bucket_elements)
      continue;
    unit_begin = specs[i].offset;
    ends.push_back(unit_begin);
  }
  ends.push_back(table.total_numel());
  return ends;
}

}  // namespace ulysses
