// What a block and its attention schedule (core/model/attention_schedule.h) both use:
// a layer's tensors by role, the q/k/v projections, a rank's share of a micro-batch, RoPE at
// its positions and the linear layer. Shapes as in core/model/layers.h.
#pragma once

#include <array>
#include <functional>

#include "core/model/params.h"
#include "kernels/backend.h"

namespace ulysses {

// Views of one layer's tensors (parameters, or their gradients) by role, derived from
// the parameter table; roles a family does not have stay empty. window holds the flat
// elements from window_begin on (ParamTable::view).
struct LayerTensors {
  std::array<Tensor, size_t(ParamRole::count)> by_role;
  const Tensor& operator[](ParamRole role) const { return by_role[size_t(role)]; }
};
LayerTensors layer_tensors(const ParamTable& table, const Tensor& window, int64_t window_begin,
                           int layer);

// q/k/v projection weights (or their gradients) [heads·d, C] and biases: separate tensors
// in llama, row blocks of c_attn in gpt2 (biases empty in llama).
struct QkvTensors {
  Tensor wq, wk, wv, bq, bk, bv;
};
QkvTensors qkv_tensors(const LayerTensors& t, int64_t q_width, int64_t kv_width);

// Shapes of one rank's share of a micro-batch.
struct BlockShape {
  int64_t batch = 1;       // B
  int64_t seq_local = 1;   // T held by this rank
  int64_t pos_offset = 0;  // global position of this rank's first token
  // Packed documents (kernels/documents.h): the starts of the micro-batch's whole sequences,
  // or none. Attention masks across them and positions restart at each.
  Documents documents;
};

// Each piece of a document among the tokens [batch, seq_local] starting at global position
// pos_offset: visit(first_row, count, position) with its first row of the batch · seq_local,
// its length and the position inside its document it starts at (kernels/documents.h).
void for_each_document_piece(
    const Documents& documents, int64_t pos_offset, int64_t batch, int64_t seq_local,
    const std::function<void(int64_t first_row, int64_t count, int64_t position)>& visit);

// RoPE on x[B, T, h, d], this rank's tokens of shape: at their global positions, or with
// documents at their positions inside their documents (one call per piece of a document).
void rope_at_positions(Backend& backend, const Tensor& x, const BlockShape& shape, float theta,
                       bool inverse);

// out[R, O] = in[R, I] · weight[O, I]ᵀ (+ bias[O])
void linear_forward(Backend& backend, const Tensor& out, const Tensor& in, const Tensor& weight,
                    const Tensor& bias);
// din[R, I] = (or += when accumulate_din) dout · weight; dweight += doutᵀ · in;
// dbias += column sums of dout (when not empty)
void linear_backward(Backend& backend, const Tensor& din, bool accumulate_din,
                     const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight);

}  // namespace ulysses
