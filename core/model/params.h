// The one table of parameter tensors (docs/design.md, "One table of parameters"). Allocation into
// the flat buffer, the views forward/backward use, gradients, optimizer state, checkpoints and
// import/export are all derived from it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "kernels/tensor.h"

namespace ulysses {

// What a tensor does in the model; together with the layer index it finds the tensor.
enum class ParamRole {
  token_embedding,     // [V, C]
  position_embedding,  // [max_seq_len, C]  (gpt2)
  attn_norm_weight,    // [C]
  attn_norm_bias,      // [C]               (gpt2)
  q_weight,            // [H·d, C]          (llama)
  k_weight,            // [Hkv·d, C]        (llama)
  v_weight,            // [Hkv·d, C]        (llama)
  qkv_weight,          // [3C, C]           (gpt2: q, k, v stacked by rows)
  qkv_bias,            // [3C]              (gpt2)
  o_weight,            // [C, H·d]
  o_bias,              // [C]               (gpt2)
  mlp_norm_weight,     // [C]
  mlp_norm_bias,       // [C]               (gpt2)
  gate_weight,         // [F, C]            (llama)
  up_weight,           // [F, C]
  up_bias,             // [F]               (gpt2)
  down_weight,         // [C, F]
  down_bias,           // [C]               (gpt2)
  final_norm_weight,   // [C]
  final_norm_bias,     // [C]               (gpt2)
  lm_head,             // [V, C]            (llama; gpt2 ties it to token_embedding)
  count
};

struct ParamSpec {
  std::string name;  // Hugging Face Llama / nanoGPT GPT-2 name
  ParamRole role;
  int layer;  // -1 for tensors outside the blocks
  std::vector<int64_t> shape;
  int64_t offset;  // elements from the start of the flat buffer
  int64_t numel;
  bool weight_decay;  // matrices decay; norms, biases do not
  // Kind of initialisation.
  enum class Init { normal, residual_normal, ones, zeros } init;
};

class ParamTable {
 public:
  explicit ParamTable(const ModelConfig& model);

  const std::vector<ParamSpec>& specs() const { return specs_; }
  int64_t total_numel() const { return total_numel_; }
  // The tensor with this role in this layer (layer -1 for global ones); throws if absent.
  const ParamSpec& find(ParamRole role, int layer = -1) const;
  bool has(ParamRole role) const;
  const ParamSpec* find_by_name(const std::string& name) const;
  // [begin, end) of the elements of layer i in the flat buffer (layers are contiguous).
  std::pair<int64_t, int64_t> layer_range(int layer) const;

  // View of a tensor inside `window`, a buffer laid out by this table that holds the flat
  // elements [window_begin, window_begin + window.numel()) (all of them when 0 and whole).
  Tensor view(const Tensor& window, int64_t window_begin, const ParamSpec& spec) const;

 private:
  void add(ParamRole role, int layer, std::string name, std::vector<int64_t> shape,
           ParamSpec::Init init);

  std::vector<ParamSpec> specs_;
  std::vector<int> index_;  // [(layer + 1) * count + role] -> index in specs_, or -1
  int n_layers_;
  int64_t total_numel_ = 0;
};

// The tensors that flat elements [begin, begin + count) fall in, in flat order: calls
// piece(spec, first, n, done) for elements [first, first + n) of spec, which are the range's
// elements [done, done + n). Throws std::out_of_range when the range leaves the buffer.
void for_each_tensor_piece(const ParamTable& table, int64_t begin, int64_t count,
                           const std::function<void(const ParamSpec& spec, int64_t first, int64_t n,
                                                    int64_t done)>& piece);

// The ZeRO units of the table (parallel/shard_layout.h), as the end of each: the tensors
// before the first layer, then runs of whole consecutive layers of at most bucket_elements
// each (at least one layer), then the tensors after the last layer.
std::vector<int64_t> shard_unit_ends(const ParamTable& table, int64_t bucket_elements);

}  // namespace ulysses
