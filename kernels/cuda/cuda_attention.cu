// CudaBackend: native causal attention. Head dims that are multiples of 8 up to 128 (with
// 16-byte aligned tensors, as the backend's own buffers are) run on tensor cores:
// FlashAttention-2's partition with mma.sync m16n8k16, cp.async double buffering and the
// backward recomputing P from the saved log-sum-exp (cuda_attention_mma.cuh). Other head dims
// run the flash-style FMA kernels (cuda_attention_kernels.cuh): a block of 256 threads owns 64
// rows, four threads per row, tiles in shared memory with padded rows. Both write the same
// out and lse, so either forward feeds either backward (or cuDNN's), and both mask packed
// documents by the one helper, cuda_attention_mask.cuh. docs/cuda.md, "Attention".
//
// Backward, both kinds: D = rowsum(dO ∘ O), then dQ per query tile, and dK/dV per key tile
// looping over the q heads of its GQA group and the query tiles after it. Each output element
// is written by one thread in a fixed order, with no atomics: results are bit-identical from
// run to run.
//
// Ring attention's blocks (kernels/backend.h, attention_block_forward) run the same kernels
// with the block's positions in the mask (cuda_attention_mask.cuh); a merged block's result
// and a block's gradients pass through scratch (kernels/op_scratch.h) before they are folded
// in. With kernels.attention: cudnn the diagonal blocks take the causal graph and the blocks
// whose keys all precede their queries the unmasked one.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_attention_kernels.cuh"
#include "kernels/cuda/cuda_attention_mma.cuh"
#include "kernels/cuda/cuda_backend_impl.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/op_contracts.h"
#include "kernels/op_scratch.h"

namespace ulysses {

using cuda::bf16;
using cuda::check_cuda;
using cuda::check_launch;
using cuda::LaunchShape;
using namespace cuda_attention;

namespace {

// Kernels above 48 KiB of dynamic shared memory must opt in.
template <typename Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, const char* op) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             op);
}

// The kernels' limits are this backend's part of the contract; the front checked the shapes
// and dtypes (kernels/op_contracts.h).
AttentionDims checked_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const char* op) {
  const contracts::AttentionShape s = contracts::attention_shape(q, k);
  if (s.dim < 2 || s.dim > kMaxHeadDim || s.dim % 2 != 0)
    throw std::invalid_argument(std::string(op) + ": head dim " + std::to_string(s.dim) +
                                " is not supported by the native cuda attention (even, 2..." +
                                std::to_string(kMaxHeadDim) + ")");
  if (s.batch > 65535 || s.q_heads > 65535)
    throw std::invalid_argument(std::string(op) + ": batch and heads must be at most 65535");
  return {s.seq_len, int(s.q_heads), int(s.kv_heads), int(s.dim),
          float(1.0 / std::sqrt(double(s.dim)))};
}

// cuDNN's fused attention here has no document mask (docs/cuda.md).
void refuse_cudnn_documents(const char* op) {
  throw std::invalid_argument(std::string(op) +
                              ": kernels.attention: cudnn cannot mask packed documents "
                              "(data.documents: eos, or a train.seq_len that parallel.sp does "
                              "not divide); use kernels.attention: native or auto");
}

// The document starts as one small i32 device buffer (cuda_attention_mask.cuh); empty
// without documents. Freed in stream order, so it outlives the kernels that read it.
Buffer upload_documents(Backend& backend, const Documents& documents) {
  const std::vector<int32_t> words = document_mask_words(documents);
  if (words.empty()) return Buffer();
  Buffer buffer = backend.alloc(MemCategory::workspace, DType::i32, {int64_t(words.size())},
                                "attention document starts");
  backend.upload(buffer, words.data());
  return buffer;
}

// The mask of a block at (q_first, k_first) over the uploaded document starts.
AttentionMask mask_of(const Buffer& words, int64_t q_first, int64_t k_first) {
  return attention_mask_at(
      words.empty() ? nullptr : static_cast<const int32_t*>(words.tensor().data), q_first, k_first);
}

#ifdef ULYSSES_WITH_CUDNN
// Which cuDNN graph computes a block, if one can: the diagonal (queries and keys at the same
// positions) is the causal graph, a block whose keys all precede its queries the unmasked
// one. Others (not made by ring attention) run the native kernels.
enum class CudnnBlock { none, causal, full };
CudnnBlock cudnn_block(int64_t seq_len, int64_t q_first, int64_t k_first) {
  if (q_first == k_first) return CudnnBlock::causal;
  if (k_first + seq_len - 1 <= q_first) return CudnnBlock::full;
  return CudnnBlock::none;
}
#endif

}  // namespace

void CudaBackend::attention_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                                         const Tensor& k, const Tensor& v,
                                         const Documents& documents) {
  attention_into(out, lse, q, k, v, 0, 0, documents, "attention_forward");
}

void CudaBackend::attention_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                          const Tensor& dout, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const Tensor& out, const Tensor& lse,
                                          const Documents& documents) {
  attention_gradients_into(dq, dk, dv, dout, q, k, v, out, lse, 0, 0, documents,
                           "attention_backward");
}

// The block's result goes straight into out and lse, or into scratch that the merge kernel
// then folds into them (cuda_attention_kernels.cuh, attention_merge_kernel).
void CudaBackend::attention_block_forward_impl(const Tensor& out, const Tensor& lse,
                                               const Tensor& q, const Tensor& k, const Tensor& v,
                                               int64_t q_first, int64_t k_first, bool merge,
                                               const Documents& documents) {
  const char* op = "attention_block_forward";
  if (!merge) return attention_into(out, lse, q, k, v, q_first, k_first, documents, op);
  const AttentionDims dims = checked_dims(q, k, v, out, lse, op);
  if (q.numel() == 0) return;
  const AttentionBlockOutputs block = attention_block_outputs(*this, out, lse);
  const Tensor block_out = block.out.tensor(), block_lse = block.lse.tensor();
  attention_into(block_out, block_lse, q, k, v, q_first, k_first, documents, op);
  const int64_t rows = q.shape[0] * dims.seq_len * dims.q_heads;
  const LaunchShape shape = attention_merge_launch(rows);
  attention_merge_kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
      static_cast<bf16*>(out.data), lse.f32(), static_cast<const bf16*>(block_out.data),
      block_lse.f32(), dims, rows);
  check_launch(op);
}

// The block's gradients go to scratch and are then added (Backend::axpy, in f32, rounded once
// to bf16 per add).
void CudaBackend::attention_block_backward_impl(const Tensor& dq, const Tensor& dk,
                                                const Tensor& dv, const Tensor& dout,
                                                const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Tensor& out, const Tensor& lse,
                                                int64_t q_first, int64_t k_first,
                                                const Documents& documents) {
  if (q.numel() == 0) return;
  const AttentionBlockGradients block = attention_block_gradients(*this, dq, dk, dv);
  const Tensor block_dq = block.dq.tensor().reshape({dq.dim(0), dq.dim(1), dq.dim(2), dq.dim(3)});
  const Tensor block_dk = block.dk.tensor().reshape({dk.dim(0), dk.dim(1), dk.dim(2), dk.dim(3)});
  const Tensor block_dv = block.dv.tensor().reshape({dv.dim(0), dv.dim(1), dv.dim(2), dv.dim(3)});
  attention_gradients_into(block_dq, block_dk, block_dv, dout, q, k, v, out, lse, q_first, k_first,
                           documents, "attention_block_backward");
  axpy(dq, block_dq, 1.0f);
  axpy(dk, block_dk, 1.0f);
  axpy(dv, block_dv, 1.0f);
}

void CudaBackend::attention_into(const Tensor& out, const Tensor& lse, const Tensor& q,
                                 const Tensor& k, const Tensor& v, int64_t q_first, int64_t k_first,
                                 const Documents& documents, const char* op) {
  const AttentionDims dims = checked_dims(q, k, v, out, lse, op);
  if (q.numel() == 0) return;
#ifdef ULYSSES_WITH_CUDNN
  if (cudnn_attention_ && !documents.none()) refuse_cudnn_documents(op);
  const CudnnBlock block = cudnn_block(dims.seq_len, q_first, k_first);
  if (cudnn_attention_ && block != CudnnBlock::none)
    return cudnn_attention_->forward(out, lse, q, k, v, block == CudnnBlock::causal);
#endif
  const Buffer document_words = upload_documents(*this, documents);
  const bool tensor_cores = mma_attention_fits(dims.dim, q.data, k.data, v.data, q.data);
  const LaunchShape shape = tensor_cores ? attention_forward_mma_launch(dims, q.shape[0])
                                         : attention_forward_launch(dims, q.shape[0]);
  auto launch = [&](auto kernel) {
    allow_shared_memory(kernel, shape.shared_bytes, op);
    kernel<<<shape.grid, shape.threads, shape.shared_bytes, stream_>>>(
        static_cast<bf16*>(out.data), lse.f32(), static_cast<const bf16*>(q.data),
        static_cast<const bf16*>(k.data), static_cast<const bf16*>(v.data), dims,
        mask_of(document_words, q_first, k_first));
  };
  const bool narrow = kernel_dim(dims.dim) == 64;
  if (tensor_cores)
    launch(narrow ? attention_forward_mma_kernel<64> : attention_forward_mma_kernel<128>);
  else
    launch(narrow ? attention_forward_kernel<64> : attention_forward_kernel<128>);
  check_launch(op);
}

void CudaBackend::attention_gradients_into(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                           const Tensor& dout, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           int64_t q_first, int64_t k_first,
                                           const Documents& documents, const char* op) {
  const AttentionDims dims = checked_dims(q, k, v, out, lse, op);
  if (q.numel() == 0) return;
#ifdef ULYSSES_WITH_CUDNN
  if (cudnn_attention_ && !documents.none()) refuse_cudnn_documents(op);
  const CudnnBlock block = cudnn_block(dims.seq_len, q_first, k_first);
  if (cudnn_attention_ && block != CudnnBlock::none)
    return cudnn_attention_->backward(dq, dk, dv, dout, q, k, v, out, lse,
                                      block == CudnnBlock::causal);
#endif
  const int64_t batch = q.shape[0];
  const Buffer document_words = upload_documents(*this, documents);
  const AttentionMask mask = mask_of(document_words, q_first, k_first);

  Buffer row_dot = attention_row_dot(*this, batch, dims.q_heads, dims.seq_len);
  const int64_t rows = batch * dims.seq_len * dims.q_heads;
  const LaunchShape row_dot_shape = attention_row_dot_launch(rows);
  attention_row_dot_kernel<<<row_dot_shape.grid, row_dot_shape.threads, row_dot_shape.shared_bytes,
                             stream_>>>(row_dot.f32(), static_cast<const bf16*>(dout.data),
                                        static_cast<const bf16*>(out.data), dims, rows);
  check_launch(op);

  const auto* dout_data = static_cast<const bf16*>(dout.data);
  const auto* q_data = static_cast<const bf16*>(q.data);
  const auto* k_data = static_cast<const bf16*>(k.data);
  const auto* v_data = static_cast<const bf16*>(v.data);
  const bool tensor_cores = mma_attention_fits(dims.dim, q.data, k.data, v.data, dout.data);
  const LaunchShape dq_shape =
      tensor_cores ? attention_dq_mma_launch(dims, batch) : attention_dq_launch(dims, batch);
  const LaunchShape dkv_shape =
      tensor_cores ? attention_dkv_mma_launch(dims, batch) : attention_dkv_launch(dims, batch);
  auto launch = [&](auto dq_kernel, auto dkv_kernel) {
    allow_shared_memory(dq_kernel, dq_shape.shared_bytes, op);
    dq_kernel<<<dq_shape.grid, dq_shape.threads, dq_shape.shared_bytes, stream_>>>(
        static_cast<bf16*>(dq.data), dout_data, q_data, k_data, v_data, lse.f32(), row_dot.f32(),
        dims, mask);
    check_launch(op);
    allow_shared_memory(dkv_kernel, dkv_shape.shared_bytes, op);
    dkv_kernel<<<dkv_shape.grid, dkv_shape.threads, dkv_shape.shared_bytes, stream_>>>(
        static_cast<bf16*>(dk.data), static_cast<bf16*>(dv.data), dout_data, q_data, k_data, v_data,
        lse.f32(), row_dot.f32(), dims, mask);
    check_launch(op);
  };
  const bool narrow = kernel_dim(dims.dim) == 64;
  if (tensor_cores && narrow)
    launch(attention_dq_mma_kernel<64>, attention_dkv_mma_kernel<64>);
  else if (tensor_cores)
    launch(attention_dq_mma_kernel<128>, attention_dkv_mma_kernel<128>);
  else if (narrow)
    launch(attention_dq_kernel<64>, attention_dkv_kernel<64>);
  else
    launch(attention_dq_kernel<128>, attention_dkv_kernel<128>);
}

}  // namespace ulysses
