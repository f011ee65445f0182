#include "core/params.h"

#include <algorithm>
#include <stdexcept>

namespace ulysses {

namespace {

constexpr int kRoles = int(ParamRole::count);

std::string layer_name(const std::string& prefix, int layer, const std::string& suffix) {
  return prefix + std::to_string(layer) + "." + suffix;
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

  if (model.family == "llama") {
    add(R::token_embedding, -1, "model.embed_tokens.weight", {V, C}, Init::normal);
    for (int i = 0; i < model.n_layers; ++i) {
      const std::string p = "model.layers.";
      add(R::attn_norm_weight, i, layer_name(p, i, "input_layernorm.weight"), {C}, Init::ones);
      add(R::q_weight, i, layer_name(p, i, "self_attn.q_proj.weight"), {q_width, C}, Init::normal);
      add(R::k_weight, i, layer_name(p, i, "self_attn.k_proj.weight"), {kv_width, C}, Init::normal);
      add(R::v_weight, i, layer_name(p, i, "self_attn.v_proj.weight"), {kv_width, C}, Init::normal);
      add(R::o_weight, i, layer_name(p, i, "self_attn.o_proj.weight"), {C, q_width},
          Init::residual_normal);
      add(R::mlp_norm_weight, i, layer_name(p, i, "post_attention_layernorm.weight"), {C},
          Init::ones);
      add(R::gate_weight, i, layer_name(p, i, "mlp.gate_proj.weight"), {F, C}, Init::normal);
      add(R::up_weight, i, layer_name(p, i, "mlp.up_proj.weight"), {F, C}, Init::normal);
      add(R::down_weight, i, layer_name(p, i, "mlp.down_proj.weight"), {C, F},
          Init::residual_normal);
    }
    add(R::final_norm_weight, -1, "model.norm.weight", {C}, Init::ones);
    add(R::lm_head, -1, "lm_head.weight", {V, C}, Init::normal);
  } else if (model.family == "gpt2") {
    add(R::token_embedding, -1, "transformer.wte.weight", {V, C}, Init::normal);
    add(R::position_embedding, -1, "transformer.wpe.weight", {int64_t(model.max_seq_len), C},
        Init::normal);
    for (int i = 0; i < model.n_layers; ++i) {
      const std::string p = "transformer.h.";
      add(R::attn_norm_weight, i, layer_name(p, i, "ln_1.weight"), {C}, Init::ones);
      add(R::attn_norm_bias, i, layer_name(p, i, "ln_1.bias"), {C}, Init::zeros);
      add(R::qkv_weight, i, layer_name(p, i, "attn.c_attn.weight"), {3 * C, C}, Init::normal);
      add(R::qkv_bias, i, layer_name(p, i, "attn.c_attn.bias"), {3 * C}, Init::zeros);
      add(R::o_weight, i, layer_name(p, i, "attn.c_proj.weight"), {C, C}, Init::residual_normal);
      add(R::o_bias, i, layer_name(p, i, "attn.c_proj.bias"), {C}, Init::zeros);
      add(R::mlp_norm_weight, i, layer_name(p, i, "ln_2.weight"), {C}, Init::ones);
      add(R::mlp_norm_bias, i, layer_name(p, i, "ln_2.bias"), {C}, Init::zeros);
      add(R::up_weight, i, layer_name(p, i, "mlp.c_fc.weight"), {F, C}, Init::normal);
      add(R::up_bias, i, layer_name(p, i, "mlp.c_fc.bias"), {F}, Init::zeros);
      add(R::down_weight, i, layer_name(p, i, "mlp.c_proj.weight"), {C, F}, Init::residual_normal);
      add(R::down_bias, i, layer_name(p, i, "mlp.c_proj.bias"), {C}, Init::zeros);
    }
    add(R::final_norm_weight, -1, "transformer.ln_f.weight", {C}, Init::ones);
    add(R::final_norm_bias, -1, "transformer.ln_f.bias", {C}, Init::zeros);
  } else {
    throw std::invalid_argument("unknown model family '" + model.family + "'");
  }
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
