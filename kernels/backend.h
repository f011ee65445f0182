// The backend interface: allocation and every op the model needs. The model calls only
// this; implementations live in kernels/cpu (fp32 reference) and kernels/cuda.
//
// Conventions: all tensors are row-major and contiguous. "B" = sequences, "T" = tokens of a
// sequence held here, "C" = model width, "H" = heads, "d" = head dim, "V" = vocabulary.
// Ops whose gradient output says "+=" accumulate into it; the rest overwrite.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/documents.h"
#include "kernels/memory.h"
#include "kernels/op_table.h"
#include "kernels/profiler.h"
#include "kernels/tensor.h"

namespace ulysses {

namespace contracts {
struct NamedTensor;  // kernels/op_contracts.h
}

// The device a backend computes on (the config key device).
enum class BackendKind { cpu, cuda };
// The cuda backend's attention (kernels.attention): the hand-written flash-style kernels, or
// cuDNN's fused SDPA; automatic is resolved by choose_attention before a backend is made.
enum class AttentionKernel { automatic, native, cudnn };

struct AttentionChoice {
  AttentionKernel kernel = AttentionKernel::native;
  std::string reason;  // why, for the log
};

// The oldest cuDNN runtime whose fused attention graphs this build uses (9.16).
inline constexpr int64_t kCudnnAttentionMinimumVersion = 91600;

// kernels.attention: auto takes cuDNN on the cuda device where this build has it, the loaded
// library is at least 9.16 (cudnn_version is cudnnGetVersion(), 0 where the build has no
// cuDNN), the head dim is a multiple of 8 and at most 128, and attention has no documents
// (packed documents or padding, which only the native kernels mask); else the native kernels.
// An explicit native or cudnn is returned as it is (the config checks it).
AttentionChoice choose_attention(AttentionKernel setting, BackendKind device, int head_dim,
                                 int64_t cudnn_version, bool documents = false);

// Which of the cuda backend's native attention kernels a head dim runs, for the log: the
// tensor-core ones (head dims that are multiples of 8 up to 128, 16-byte aligned tensors) or
// the FMA ones (docs/cuda.md, "Attention").
std::string native_attention_kernels(int head_dim);

struct LossResult {
  double loss_sum = 0.0;  // sum of -log p(target) over counted tokens
  int64_t count = 0;      // tokens whose target is >= 0
  int64_t correct = 0;    // counted tokens whose argmax equals the target
};

struct AdamWStep {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: p -= lr * weight_decay * p
  int64_t step = 1;           // 1-based, for bias correction
  float grad_scale = 1.0f;    // multiplies the gradient first (global-norm clipping)
};

class Backend {
 public:
  explicit Backend(int64_t memory_limit_bytes) : memory_(memory_limit_bytes) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;
  // The kind of device this backend computes on, or plans for: the ops' dtype rules follow it
  // (kernels/op_dtypes.h).
  virtual BackendKind kind() const = 0;
  // Element type of weights and activations used in the forward pass (f32 on cpu).
  virtual DType compute_dtype() const = 0;
  virtual void set_num_threads(int threads) = 0;
  // What in this backend's setup costs speed, as a sentence for the log; empty when nothing.
  virtual std::string setup_warning() const { return ""; }
  // What this backend chose for this machine, as a sentence for the log; empty when nothing.
  virtual std::string setup_note() const { return ""; }
  // memory.loss_tile_tokens: auto, for an LM head of [vocab, width] (kernels/op_scratch.h).
  virtual int64_t auto_loss_tile_tokens(int64_t vocab, int64_t width) const;

  MemoryTracker& memory() { return memory_; }
  const MemoryTracker& memory() const { return memory_; }
  // Where the step's time goes (kernels/profiler.h), kept next to the memory it spends.
  Profiler& profiler() { return profiler_; }
  Buffer alloc(MemCategory category, DType dtype, std::initializer_list<int64_t> dims,
               const std::string& what) {
    return Buffer(this, category, dtype, dims, what);
  }

  // As alloc, every byte zero. Where fresh memory comes zero, its pages are touched only when
  // first written: on the cpu backend the gradients and optimizer moments, zero at startup,
  // are first written by step 1 (docs/performance.md, "Startup").
  Buffer alloc_zeroed(MemCategory category, DType dtype, std::initializer_list<int64_t> dims,
                      const std::string& what) {
    return Buffer(this, category, dtype, dims, what, true);
  }

  // Untracked raw memory; use alloc() (a tracked Buffer) instead.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* pointer) = 0;
  // Untracked raw memory that is zero, for alloc_zeroed, or null where this backend has none
  // that comes zero (the buffer is then allocated and filled); raw_free frees it.
  virtual void* raw_alloc_zeroed(size_t /*bytes*/) { return nullptr; }
  // Host memory that upload and download move fastest (page-locked on cuda), for staging
  // device buffers through the host. Not tracked: it is not the backend's memory. Defined
  // here, not in backend.cpp: a Backend without a key function keeps its type info in every
  // library that uses it, the cuda one included.
  virtual void* host_staging_alloc(size_t bytes) {
    return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(64));
  }
  virtual void host_staging_free(void* pointer) {
    ::operator delete(pointer, std::align_val_t(64));
  }

  // ---- memory the machine has (docs/memory.md, "Memory the machine has") ---------------
  struct AvailableMemory {
    int64_t bytes = 0;            // what the backend's tensors could still take; 0: not known
    bool shared_by_node = false;  // host memory, which every rank of the node draws on
    std::string source;           // where the number comes from, for messages
  };
  // As the system reports it now; the planning and emulated backends know none.
  virtual AvailableMemory available_memory() const { return {}; }

  // ---- offloaded layer inputs (memory.offload_checkpoints, docs/memory.md) -------------
  // Whether host memory is apart from the backend's (cuda): only then do offloaded layer
  // inputs move out and back. Buffers of category checkpoints_host are host staging memory.
  virtual bool host_memory_is_separate() const { return false; }
  // Copies src to dst (same bytes; one of them a checkpoints_host buffer) beside the compute:
  // the copy starts once the ops enqueued so far are done. Ops enqueued after
  // wait_transfer(ticket) see it, and every earlier one, finished. This default copies at once.
  virtual int64_t transfer(const Tensor& dst, const Tensor& src) {
    copy(dst, src);
    return ++transfers_issued_;
  }
  virtual void wait_transfer(int64_t /*ticket*/) {}

  // ---- uploads staged through host staging memory (the weights at startup) --------------
  // Starts copying host_src, host staging memory (host_staging_alloc), to dst, ordered before
  // the ops enqueued after it, and returns its ticket: the host may fill the next piece while
  // this one travels, but host_src must stay as it is until wait_upload(ticket) returned.
  // This default copies at once.
  virtual int64_t upload_async(const Tensor& dst, const void* host_src) {
    upload(dst, host_src);
    return ++uploads_issued_;
  }
  // Returns once upload `ticket` and every earlier one have read their host memory.
  virtual void wait_upload(int64_t /*ticket*/) {}

  // The kernel plans (cuBLASLt heuristics, cuDNN graphs) built since the last call and the
  // host time they took, as a phrase for the log ("12 cuBLASLt plans in 0.21 s"); empty when
  // none were built. Plans are built when an op first meets a shape: mostly in step 1.
  virtual std::string take_plans_built() { return ""; }

  // ---- the ops ---------------------------------------------------------------------------
  // The ops are listed once, in kernels/op_table.h. Each op is a non-virtual front
  // (kernels/backend.cpp): it checks the op's contract, the shape and dtype rules every backend
  // shares (kernels/op_contracts.h; upload, download and fill_zero take any tensor, scale and
  // sum_squares any float one), and then calls the backend's <op>_impl below. Each
  // implementation checks only what is its own: its kernels' limits and the values of tensor
  // data it reads.

  // ---- data movement -------------------------------------------------------------------
  void upload(const Tensor& dst, const void* host_src);
  void download(void* host_dst, const Tensor& src);
  void copy(const Tensor& dst, const Tensor& src);  // same dtype and numel
  void cast(const Tensor& dst, const Tensor& src);  // f32 <-> bf16, same numel
  void fill_zero(const Tensor& dst);
  // rows × row_bytes from src (pitch src_pitch bytes) to dst (pitch dst_pitch bytes).
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows);
  virtual void synchronize() = 0;

  // ---- elementwise ---------------------------------------------------------------------
  // y += alpha * x
  void axpy(const Tensor& y, const Tensor& x, float alpha);
  void scale(const Tensor& x, float alpha);
  // sum of x*x in double precision
  double sum_squares(const Tensor& x);

  // ---- GEMM ----------------------------------------------------------------------------
  // c = alpha * op(a) · op(b) + beta * c, all 2-D; op(a) is [M, K], op(b) is [K, N],
  // c is [M, N]; op transposes when trans_* is set.
  void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            float alpha, float beta);
  // out[R, N] += bias[N] on every row.
  void bias_forward(const Tensor& out, const Tensor& bias);
  // dbias[N] += sum over rows of dout[R, N]
  void bias_backward(const Tensor& dbias, const Tensor& dout);

  // ---- embedding -----------------------------------------------------------------------
  // out[B, T, C] = wte[tokens[b, t]] (+ wpe[pos_offset + t] when wpe is not empty)
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe, int64_t pos_offset);
  // dwte += scatter of dout by token; dwpe[pos_offset + t] += sum over b of dout[b, t]
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, int64_t pos_offset);

  // ---- normalisation (rows of width C) -------------------------------------------------
  // out = x * rstd * weight, rstd[R] = 1 / sqrt(mean(x^2) + eps)
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                       float eps);
  // dx +=, dweight +=; dx may be the same memory as dout
  void rmsnorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& rstd);
  // out = (x - mean) * rstd * weight + bias; saves mean[R], rstd[R]
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& weight, const Tensor& bias, float eps);
  // dx +=, dweight +=, dbias +=; dx may be the same memory as dout
  void layernorm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                          const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd);

  // ---- position and activation functions -----------------------------------------------
  // In place on x[B, T, H, d]: rotate_half RoPE (Hugging Face Llama) at positions
  // pos_offset + t; inverse = true applies the transpose rotation (the backward).
  void rope(const Tensor& x, int64_t pos_offset, float theta, bool inverse);
  // out = silu(gate) * up, all [R, F]
  void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up);
  // dgate, dup overwritten; dout may be the same memory as dgate or dup, and dgate and dup
  // may be gate and up themselves (elementwise)
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                       const Tensor& gate, const Tensor& up);
  // tanh-approximation GELU (GPT-2)
  void gelu_forward(const Tensor& out, const Tensor& x);
  // dx overwritten; dx may be the same memory as dout (elementwise)
  void gelu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x);

  // ---- attention -----------------------------------------------------------------------
  // Causal attention with online softmax: q[B, T, Hq, d], k/v[B, T, Hkv, d] (Hq % Hkv == 0;
  // q head h reads kv head h / (Hq / Hkv)), out[B, T, Hq, d], lse[B, Hq, T] (f32,
  // log-sum-exp of the scaled scores). Scale 1/sqrt(d). Memory O(T·d), never O(T²).
  // With documents (kernels/documents.h), query t sees only the keys of its own document
  // up to itself, and key tiles wholly in earlier documents are skipped.
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Documents& documents = {});
  // dq, dk, dv overwritten; recomputes scores from lse; documents as the forward had them.
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Documents& documents = {});

  // One block of attention, for ring attention (docs/parallelism.md, "Ulysses × ring"): the
  // same shapes, but query i sits at position q_first + i and key j at k_first + j, and key j
  // is visible from query i when attention_visible(q_first + i, k_first + j, start of the
  // document of q_first + i). documents hold the starts of the whole sequences in these same
  // positions (the block is a window of them). A query that sees no key of the block gets
  // out 0 and lse −inf. merge = false overwrites out and lse; merge = true combines this
  // block's result with the one they hold (an earlier block over the same queries) by
  // log-sum-exp in f32: lse = log(e^lse + e^lse_block),
  // out = out·e^(lse_old − lse) + out_block·e^(lse_block − lse).
  // attention_forward is attention_block_forward(out, lse, q, k, v, 0, 0, false, documents).
  void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                               const Tensor& k, const Tensor& v, int64_t q_first, int64_t k_first,
                               bool merge, const Documents& documents = {});
  // dq += , dk += , dv += this block's share of the gradient; out and lse are those of the
  // whole attention (every block merged), so P = exp(S − lse) is the block's part of the
  // softmax; documents as the forward had them.
  void attention_block_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse,
                                int64_t q_first, int64_t k_first, const Documents& documents = {});

  // ---- fused LM head + cross-entropy ---------------------------------------------------
  // hidden[R, C], weight[V, C], targets[R] (i32, < 0 = not counted). Works over tiles of
  // tile_rows rows so that [R, V] logits never exist. When dhidden is not empty:
  // dhidden[R, C] = grad_scale * (softmax - onehot) · weight (overwritten; zero on rows
  // not counted) and dweight[V, C] += grad_scale * (softmax - onehot)^T · hidden.
  LossResult lm_head_loss(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                          int64_t tile_rows, float grad_scale, const Tensor& dhidden,
                          const Tensor& dweight);

  // ---- optimizer -----------------------------------------------------------------------
  // AdamW on f32 param/grad/m/v of equal numel (PyTorch semantics).
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWStep& step);

 protected:
  // The implementations behind the fronts above, one per row of kernels/op_table.h, called
  // with arguments that meet the op's contract.
#define ULYSSES_DECLARE_PURE_OP_IMPL(result, name, parameters) \
  virtual result name##_impl parameters = 0;
  ULYSSES_BACKEND_OPS(ULYSSES_DECLARE_PURE_OP_IMPL)
#undef ULYSSES_DECLARE_PURE_OP_IMPL

 private:
  // An op's aliasing rule (kernels/op_contracts.h), checked where the buffers are real.
  void require_apart(const char* op, std::initializer_list<contracts::NamedTensor> outputs,
                     std::initializer_list<contracts::NamedTensor> inputs) const;

  MemoryTracker memory_;
  int64_t transfers_issued_ = 0;
  int64_t uploads_issued_ = 0;
  Profiler profiler_;
};

// The name of every op, in kernels/op_table.h's order.
inline constexpr const char* kBackendOpNames[] = {ULYSSES_BACKEND_OPS(ULYSSES_OP_NAME)};

// The one masking rule of attention, kept as one predicate: key position k is visible from
// query position q when it is not later (causal) and lies in q's document, which begins at
// q_document_start (0 without packed documents; kernels/documents.h).
inline bool attention_visible(int64_t q, int64_t k, int64_t q_document_start = 0) {
  return k <= q && k >= q_document_start;
}

// The device asked for is not there: a build without CUDA, or no usable GPU. Every rank
// sees the same, so the binary treats it like a config error (exit status 2).
class DeviceUnavailableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// attention cudnn needs the cuda device (std::invalid_argument otherwise) and automatic is
// refused (resolve it with choose_attention first). Throws
// DeviceUnavailableError when the device is not available in this build or on this machine.
std::unique_ptr<Backend> make_backend(BackendKind device, int64_t memory_limit_bytes,
                                      AttentionKernel attention = AttentionKernel::native);

// True when this binary was built with the CUDA backend.
bool cuda_backend_compiled();
// The cuDNN library this process loads, as cudnnGetVersion() (e.g. 91900); 0 when the build
// has no cuDNN. Needs no GPU.
int64_t cudnn_loaded_version();
// GPUs this process can see: 0 without the CUDA backend or when CUDA reports an error.
int cuda_devices_visible();

}  // namespace ulysses
