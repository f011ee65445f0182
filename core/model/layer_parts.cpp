#include "core/model/layer_parts.h"

namespace ulysses {

namespace {

using R = ParamRole;

}  // namespace

QkvTensors qkv_tensors(const LayerTensors& t, int64_t q_width, int64_t kv_width) {
  if (!t[R::q_weight].empty()) return {t[R::q_weight], t[R::k_weight], t[R::v_weight], {}, {}, {}};
  const Tensor& w = t[R::qkv_weight];
  const Tensor& b = t[R::qkv_bias];
  return {w.slice_rows(0, q_width),
          w.slice_rows(q_width, q_width + kv_width),
          w.slice_rows(q_width + kv_width, q_width + 2 * kv_width),
          b.flat_range(0, q_width),
          b.flat_range(q_width, kv_width),
          b.flat_range(q_width + kv_width, kv_width)};
}

void for_each_document_piece(
    const Documents& documents, int64_t pos_offset, int64_t batch, int64_t seq_local,
    const std::function<void(int64_t first_row, int64_t count, int64_t position)>& visit) {
  for (int64_t b = 0; b < batch; ++b)
    for (const DocumentPiece& piece :
         document_pieces(documents.starts[size_t(b)], pos_offset, seq_local))
      visit(b * seq_local + piece.begin - pos_offset, piece.end - piece.begin, piece.position);
}

void rope_at_positions(Backend& backend, const Tensor& x, const BlockShape& shape, float theta,
                       bool inverse) {
  if (shape.documents.none()) {
    backend.rope(x, shape.pos_offset, theta, inverse);
    return;
  }
  const int64_t heads = x.dim(2), d = x.dim(3);
  for_each_document_piece(
      shape.documents, shape.pos_offset, x.dim(0), x.dim(1),
      [&](int64_t first, int64_t count, int64_t position) {
        backend.rope(
            x.flat_range(first * heads * d, count * heads * d).reshape({1, count, heads, d}),
            position, theta, inverse);
      });
}

LayerTensors layer_tensors(const ParamTable& table, const Tensor& window, int64_t window_begin,
                           int layer) {
  LayerTensors tensors;
  for (const ParamSpec& spec : table.specs())
    if (spec.layer == layer)
      tensors.by_role[size_t(spec.role)] = table.view(window, window_begin, spec);
  return tensors;
}

void linear_forward(Backend& backend, const Tensor& out, const Tensor& in, const Tensor& weight,
                    const Tensor& bias) {
  backend.gemm(in, false, weight, true, out, 1.0f, 0.0f);
  if (!bias.empty()) backend.bias_forward(out, bias);
}

void linear_backward(Backend& backend, const Tensor& din, bool accumulate_din,
                     const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                     const Tensor& in, const Tensor& weight) {
  backend.gemm(dout, false, weight, false, din, 1.0f, accumulate_din ? 1.0f : 0.0f);
  backend.gemm(dout, true, in, false, dweight, 1.0f, 1.0f);
  if (!dbias.empty()) backend.bias_backward(dbias, dout);
}

}  // namespace ulysses
