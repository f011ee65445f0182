#include "kernels/op_contracts.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/op_dtypes.h"

namespace ulysses::contracts {

namespace {

void require_numel(const Tensor& t, int64_t numel, const char* op, const char* name) {
  if (t.numel() != numel)
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() + " has " +
                                std::to_string(t.numel()) + " elements, expected " +
                                std::to_string(numel));
}

void require_ndim(const Tensor& t, int ndim, const char* op, const char* name) {
  if (t.ndim != ndim)
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() +
                                " must be " + std::to_string(ndim) + "-D");
}

// Rows of a tensor seen as [rows, width]; throws when numel is not a multiple of width.
int64_t rows_of(const Tensor& t, int64_t width, const char* op, const char* name) {
  if (width <= 0 || t.numel() % width != 0)
    throw std::invalid_argument(std::string(op) + ": " + name + " " + t.shape_string() +
                                " is not a whole number of rows of width " + std::to_string(width));
  return t.numel() / width;
}

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype)) + " " + t.shape_string();
}

// The position table, when there is one: [P, C] like the token table, covering the positions
// [pos_offset, pos_offset + T) of the sequences.
void check_positions(const Tensor& positions, const char* name, const Tensor& tokens_table,
                     const char* tokens_name, int64_t pos_offset, int64_t seq_len, const char* op) {
  require_ndim(positions, 2, op, name);
  if (positions.shape[1] != tokens_table.shape[1])
    throw std::invalid_argument(std::string(op) + ": " + name + " " + positions.shape_string() +
                                " and " + tokens_name + " " + tokens_table.shape_string() +
                                " differ in width");
  if (pos_offset < 0 || pos_offset + seq_len > positions.shape[0])
    throw std::out_of_range(std::string(op) + ": positions [" + std::to_string(pos_offset) + ", " +
                            std::to_string(pos_offset + seq_len) + ") exceed wpe " +
                            positions.shape_string());
}

void check_attention(BackendKind kind, const Tensor& out, const Tensor& lse, const Tensor& q,
                     const Tensor& k, const Tensor& v, const Documents& documents, const char* op) {
  require_ndim(q, 4, op, "q");
  require_ndim(k, 4, op, "k");
  require_ndim(v, 4, op, "v");
  const AttentionShape s = attention_shape(q, k);
  const bool kv_ok =
      k.shape[0] == s.batch && k.shape[1] == s.seq_len && k.shape[3] == s.dim && v.shape == k.shape;
  if (!kv_ok || s.dim == 0 || s.kv_heads == 0 || s.q_heads % s.kv_heads != 0)
    throw std::invalid_argument(std::string(op) + ": q " + q.shape_string() + ", k " +
                                k.shape_string() + ", v " + v.shape_string() +
                                " do not fit q[B, T, Hq, d], k/v[B, T, Hkv, d] with Hq % Hkv == 0");
  require_numel(out, q.numel(), op, "out");
  require_numel(lse, s.batch * s.q_heads * s.seq_len, op, "lse");
  const std::string problem = documents_problem(documents, s.batch, s.seq_len);
  if (!problem.empty()) throw std::invalid_argument(std::string(op) + ": " + problem);
  DTypeRules(kind, op)
      .element(q, "q")
      .like(k, "k", q, "q")
      .like(v, "v", q, "q")
      .like(out, "out", q, "q")
      .fixed(lse, "lse", DType::f32);
}

// The norms' dtype rules: x an element tensor, its rows and the weight in its dtype, the
// statistics and weight gradients f32.
void check_norm_dtypes(BackendKind kind, const char* op, const Tensor& x,
                       std::initializer_list<NamedTensor> like_x,
                       std::initializer_list<NamedTensor> f32) {
  const DTypeRules rules(kind, op);
  rules.element(x, "x");
  for (const NamedTensor& t : like_x) rules.like(t.tensor, t.name, x, "x");
  for (const NamedTensor& t : f32) rules.fixed(t.tensor, t.name, DType::f32);
}

}  // namespace

AttentionShape attention_shape(const Tensor& q, const Tensor& k) {
  return {q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
}

int64_t sequence_length(const Tensor& tokens) {
  return tokens.ndim > 0 ? tokens.dim(-1) : 0;
}

void check_copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype != src.dtype || dst.numel() != src.numel())
    throw std::invalid_argument("copy: dst " + describe(dst) + " and src " + describe(src) +
                                " differ in type or element count");
}

void check_cast(const Tensor& dst, const Tensor& src) {
  require_numel(dst, src.numel(), "cast", "dst");
  const bool narrows = src.dtype == DType::f32 && dst.dtype == DType::bf16;
  const bool widens = src.dtype == DType::bf16 && dst.dtype == DType::f32;
  if (dst.dtype != src.dtype && !narrows && !widens)
    throw std::invalid_argument(std::string("cast: unsupported ") + dtype_name(src.dtype) + " -> " +
                                dtype_name(dst.dtype) + " (only f32 <-> bf16)");
}

void check_copy_2d(int64_t dst_pitch, int64_t src_pitch, int64_t row_bytes, int64_t rows) {
  if (row_bytes < 0 || rows < 0 || (rows > 1 && (dst_pitch < row_bytes || src_pitch < row_bytes)))
    throw std::invalid_argument("copy_2d: pitches must be at least row_bytes (" +
                                std::to_string(row_bytes) + "), got dst " +
                                std::to_string(dst_pitch) + " src " + std::to_string(src_pitch));
}

void check_axpy(BackendKind kind, const Tensor& y, const Tensor& x) {
  require_numel(x, y.numel(), "axpy", "x");
  DTypeRules(kind, "axpy").element(y, "y").element(x, "x");
  // A bf16 sum of f32 terms would round each one: only a wider y takes a narrower x.
  if (y.dtype == DType::bf16 && x.dtype == DType::f32)
    throw std::invalid_argument("axpy: y " + describe(y) + " is bf16 but x " + describe(x) +
                                " is f32 (supported: same dtypes, or f32 y with bf16 x)");
}

void check_elementwise(BackendKind kind, const char* op, const Tensor& x) {
  DTypeRules(kind, op).element(x, "x");
}

void check_gemm(BackendKind kind, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                const Tensor& c) {
  require_ndim(a, 2, "gemm", "a");
  require_ndim(b, 2, "gemm", "b");
  require_ndim(c, 2, "gemm", "c");
  const int64_t m = trans_a ? a.shape[1] : a.shape[0];
  const int64_t k = trans_a ? a.shape[0] : a.shape[1];
  const int64_t k_b = trans_b ? b.shape[1] : b.shape[0];
  const int64_t n = trans_b ? b.shape[0] : b.shape[1];
  if (k != k_b || c.shape[0] != m || c.shape[1] != n)
    throw std::invalid_argument("gemm: shapes do not match: a " + a.shape_string() +
                                (trans_a ? "^T" : "") + " · b " + b.shape_string() +
                                (trans_b ? "^T" : "") + " -> c " + c.shape_string() +
                                " (need op(a) [M, K], op(b) [K, N], c [M, N])");
  DTypeRules(kind, "gemm").element(a, "a").like(b, "b", a, "a").element(c, "c");
  if (a.dtype == DType::f32 && c.dtype != DType::f32)
    throw std::invalid_argument("gemm: f32 inputs a " + describe(a) + " and b " + describe(b) +
                                " need an f32 c (got " + describe(c) + ")");
}

void check_bias_forward(BackendKind kind, const Tensor& out, const Tensor& bias) {
  rows_of(out, bias.numel(), "bias_forward", "out");
  DTypeRules(kind, "bias_forward").element(out, "out").element(bias, "bias");
}

void check_bias_backward(BackendKind kind, const Tensor& dbias, const Tensor& dout) {
  rows_of(dout, dbias.numel(), "bias_backward", "dout");
  DTypeRules(kind, "bias_backward").element(dout, "dout").fixed(dbias, "dbias", DType::f32);
}

void check_embedding_forward(BackendKind kind, const Tensor& out, const Tensor& tokens,
                             const Tensor& wte, const Tensor& wpe, int64_t pos_offset) {
  const char* op = "embedding_forward";
  require_ndim(wte, 2, op, "wte");
  require_numel(out, tokens.numel() * wte.shape[1], op, "out");
  if (!wpe.empty())
    check_positions(wpe, "wpe", wte, "wte", pos_offset, sequence_length(tokens), op);
  const DTypeRules rules(kind, op);
  rules.element(wte, "wte").like(out, "out", wte, "wte").fixed(tokens, "tokens", DType::i32);
  if (!wpe.empty()) rules.like(wpe, "wpe", wte, "wte");
}

void check_embedding_backward(BackendKind kind, const Tensor& dwte, const Tensor& dwpe,
                              const Tensor& dout, const Tensor& tokens, int64_t pos_offset) {
  const char* op = "embedding_backward";
  require_ndim(dwte, 2, op, "dwte");
  require_numel(dout, tokens.numel() * dwte.shape[1], op, "dout");
  if (!dwpe.empty())
    check_positions(dwpe, "dwpe", dwte, "dwte", pos_offset, sequence_length(tokens), op);
  const DTypeRules rules(kind, op);
  rules.element(dout, "dout").fixed(dwte, "dwte", DType::f32).fixed(tokens, "tokens", DType::i32);
  if (!dwpe.empty()) rules.fixed(dwpe, "dwpe", DType::f32);
}

void check_rmsnorm_forward(BackendKind kind, const Tensor& out, const Tensor& rstd, const Tensor& x,
                           const Tensor& weight) {
  const char* op = "rmsnorm_forward";
  const int64_t rows = rows_of(x, weight.numel(), op, "x");
  require_numel(out, x.numel(), op, "out");
  require_numel(rstd, rows, op, "rstd");
  check_norm_dtypes(kind, op, x, {{out, "out"}, {weight, "weight"}}, {{rstd, "rstd"}});
}

void check_rmsnorm_backward(BackendKind kind, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t width = weight.numel();
  const int64_t rows = rows_of(x, width, op, "x");
  require_numel(dx, x.numel(), op, "dx");
  require_numel(dout, x.numel(), op, "dout");
  require_numel(dweight, width, op, "dweight");
  require_numel(rstd, rows, op, "rstd");
  check_norm_dtypes(kind, op, x, {{dx, "dx"}, {dout, "dout"}, {weight, "weight"}},
                    {{dweight, "dweight"}, {rstd, "rstd"}});
}

void check_layernorm_forward(BackendKind kind, const Tensor& out, const Tensor& mean,
                             const Tensor& rstd, const Tensor& x, const Tensor& weight,
                             const Tensor& bias) {
  const char* op = "layernorm_forward";
  const int64_t width = weight.numel();
  const int64_t rows = rows_of(x, width, op, "x");
  require_numel(out, x.numel(), op, "out");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  require_numel(bias, width, op, "bias");
  check_norm_dtypes(kind, op, x, {{out, "out"}, {weight, "weight"}, {bias, "bias"}},
                    {{mean, "mean"}, {rstd, "rstd"}});
}

void check_layernorm_backward(BackendKind kind, const Tensor& dx, const Tensor& dweight,
                              const Tensor& dbias, const Tensor& dout, const Tensor& x,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const int64_t width = weight.numel();
  const int64_t rows = rows_of(x, width, op, "x");
  require_numel(dx, x.numel(), op, "dx");
  require_numel(dout, x.numel(), op, "dout");
  require_numel(dweight, width, op, "dweight");
  require_numel(dbias, width, op, "dbias");
  require_numel(mean, rows, op, "mean");
  require_numel(rstd, rows, op, "rstd");
  check_norm_dtypes(kind, op, x, {{dx, "dx"}, {dout, "dout"}, {weight, "weight"}},
                    {{dweight, "dweight"}, {dbias, "dbias"}, {mean, "mean"}, {rstd, "rstd"}});
}

void check_rope(BackendKind kind, const Tensor& x, int64_t pos_offset) {
  require_ndim(x, 4, "rope", "x");
  if (x.shape[3] % 2 != 0)
    throw std::invalid_argument("rope: head dim " + std::to_string(x.shape[3]) + " is odd");
  if (pos_offset < 0) throw std::invalid_argument("rope: negative pos_offset");
  DTypeRules(kind, "rope").element(x, "x");
}

void check_swiglu_forward(BackendKind kind, const Tensor& out, const Tensor& gate,
                          const Tensor& up) {
  const int64_t n = out.numel();
  require_numel(gate, n, "swiglu_forward", "gate");
  require_numel(up, n, "swiglu_forward", "up");
  DTypeRules(kind, "swiglu_forward")
      .element(gate, "gate")
      .like(out, "out", gate, "gate")
      .like(up, "up", gate, "gate");
}

void check_swiglu_backward(BackendKind kind, const Tensor& dgate, const Tensor& dup,
                           const Tensor& dout, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  const int64_t n = dout.numel();
  require_numel(dgate, n, op, "dgate");
  require_numel(dup, n, op, "dup");
  require_numel(gate, n, op, "gate");
  require_numel(up, n, op, "up");
  DTypeRules(kind, op)
      .element(gate, "gate")
      .like(dgate, "dgate", gate, "gate")
      .like(dup, "dup", gate, "gate")
      .like(dout, "dout", gate, "gate")
      .like(up, "up", gate, "gate");
}

void check_gelu_forward(BackendKind kind, const Tensor& out, const Tensor& x) {
  require_numel(out, x.numel(), "gelu_forward", "out");
  DTypeRules(kind, "gelu_forward").element(x, "x").like(out, "out", x, "x");
}

void check_gelu_backward(BackendKind kind, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  require_numel(dx, x.numel(), "gelu_backward", "dx");
  require_numel(dout, x.numel(), "gelu_backward", "dout");
  DTypeRules(kind, "gelu_backward")
      .element(x, "x")
      .like(dx, "dx", x, "x")
      .like(dout, "dout", x, "x");
}

void check_attention_forward(BackendKind kind, const Tensor& out, const Tensor& lse,
                             const Tensor& q, const Tensor& k, const Tensor& v,
                             const Documents& documents) {
  check_attention(kind, out, lse, q, k, v, documents, "attention_forward");
}

void check_block(int64_t q_first, int64_t k_first, const Documents& documents, const Tensor& q,
                 const char* op) {
  if (q_first < 0 || k_first < 0)
    throw std::invalid_argument(std::string(op) + ": block positions must be >= 0, got q_first " +
                                std::to_string(q_first) + " and k_first " +
                                std::to_string(k_first));
  // The sequence's length is not the block's: any start past position 0 may lie beyond it.
  const std::string problem =
      documents_problem(documents, q.dim(0), std::numeric_limits<int64_t>::max());
  if (!problem.empty()) throw std::invalid_argument(std::string(op) + ": " + problem);
}

void check_attention_backward(BackendKind kind, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Documents& documents) {
  const char* op = "attention_backward";
  check_attention(kind, out, lse, q, k, v, documents, op);
  require_numel(dq, q.numel(), op, "dq");
  require_numel(dout, q.numel(), op, "dout");
  require_numel(dk, k.numel(), op, "dk");
  require_numel(dv, k.numel(), op, "dv");
  DTypeRules(kind, op)
      .like(dq, "dq", q, "q")
      .like(dk, "dk", q, "q")
      .like(dv, "dv", q, "q")
      .like(dout, "dout", q, "q");
}

void check_lm_head_loss(BackendKind kind, const Tensor& hidden, const Tensor& weight,
                        const Tensor& targets, int64_t tile_rows, const Tensor& dhidden,
                        const Tensor& dweight) {
  const char* op = "lm_head_loss";
  require_ndim(weight, 2, op, "weight");
  const int64_t vocab = weight.shape[0], width = weight.shape[1];
  const int64_t rows = rows_of(hidden, width, op, "hidden");
  require_numel(targets, rows, op, "targets");
  if (tile_rows < 1) throw std::invalid_argument("lm_head_loss: tile_rows must be >= 1");
  if (!dhidden.empty()) {
    require_numel(dhidden, rows * width, op, "dhidden");
    require_numel(dweight, vocab * width, op, "dweight");
  }
  const DTypeRules rules(kind, op);
  rules.element(hidden, "hidden")
      .like(weight, "weight", hidden, "hidden")
      .fixed(targets, "targets", DType::i32);
  if (!dhidden.empty())
    rules.like(dhidden, "dhidden", hidden, "hidden").fixed(dweight, "dweight", DType::f32);
}

void check_adamw(BackendKind kind, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, const AdamWStep& step) {
  const int64_t n = param.numel();
  require_numel(grad, n, "adamw", "grad");
  require_numel(m, n, "adamw", "m");
  require_numel(v, n, "adamw", "v");
  if (step.step < 1) throw std::invalid_argument("adamw: step must be >= 1 (1-based)");
  DTypeRules(kind, "adamw")
      .fixed(param, "param", DType::f32)
      .fixed(grad, "grad", DType::f32)
      .fixed(m, "m", DType::f32)
      .fixed(v, "v", DType::f32);
}

void check_token_ids(const int32_t* ids, int64_t count, int64_t vocab, const char* op) {
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      throw std::out_of_range(std::string(op) + ": token id " + std::to_string(ids[i]) +
                              " at index " + std::to_string(i) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  }
}

void check_target(int32_t target, int64_t row, int64_t vocab) {
  if (target >= vocab)
    throw std::out_of_range("lm_head_loss: target " + std::to_string(target) + " at row " +
                            std::to_string(row) + " is outside the vocabulary [0, " +
                            std::to_string(vocab) + ")");
}

namespace {

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty() || a.bytes() == 0 || b.bytes() == 0) return false;
  const auto* a_begin = static_cast<const char*>(a.data);
  const auto* b_begin = static_cast<const char*>(b.data);
  return a_begin < b_begin + b.bytes() && b_begin < a_begin + a.bytes();
}

}  // namespace

void require_apart(const char* op, std::initializer_list<NamedTensor> outputs,
                   std::initializer_list<NamedTensor> inputs) {
  auto fail = [&](const NamedTensor& output, const NamedTensor& other) {
    throw std::invalid_argument(std::string(op) + ": " + output.name + " " +
                                output.tensor.shape_string() + " shares memory with " + other.name +
                                " " + other.tensor.shape_string() + "; the op needs them apart");
  };
  for (auto output = outputs.begin(); output != outputs.end(); ++output) {
    for (auto other = outputs.begin(); other != output; ++other)
      if (overlap(output->tensor, other->tensor)) fail(*output, *other);
    for (const NamedTensor& input : inputs)
      if (overlap(output->tensor, input.tensor)) fail(*output, input);
  }
}

}  // namespace ulysses::contracts
