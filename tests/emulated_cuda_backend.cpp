// The CUDA backend's kernels as a host Backend (tests/emulated_cuda_backend.h). Each op follows
// its counterpart in kernels/cuda/*.cu step by step: the same kernels, launch shapes, scratch
// (kernels/op_scratch.h) and host-side plans (column chunks, the embedding's token order), so
// the test of one checks the other's device code. The loss's tile loop and the sum of squares'
// two passes are the backend's own code (lm_head_loss_tiles, sum_squares_passes), run with
// kernels launched on the host. Its device timeline (HostTimeline) lets the profiler time it as
// it times the GPU, so the device-time path runs on every machine.
#include "tests/emulated_cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/op_formulas.h"
#include "kernels/op_scratch.h"
#include "tests/cuda_emulation.h"
// After the emulation, which provides the device environment.
#include "kernels/cuda/cuda_activations_kernels.cuh"
#include "kernels/cuda/cuda_attention_kernels.cuh"
#include "kernels/cuda/cuda_attention_mma.cuh"
#include "kernels/cuda/cuda_column_sums.cuh"
#include "kernels/cuda/cuda_elementwise_kernels.cuh"
#include "kernels/cuda/cuda_loss_kernels.cuh"
#include "kernels/cuda/cuda_norms_kernels.cuh"

namespace ulysses {
namespace {

using cuda::bf16;
using Clock = DeviceTimeline::Clock;

template <typename T>
T* data_of(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// Calls fn(T{}) with T = float or bf16 after the tensor's dtype.
template <typename Fn>
void dispatch_float(const Tensor& t, Fn&& fn) {
  if (t.dtype == DType::f32) {
    fn(float{});
  } else if (t.dtype == DType::bf16) {
    fn(bf16{});
  } else {
    throw std::invalid_argument(std::string("emulated cuda: unsupported dtype ") +
                                dtype_name(t.dtype));
  }
}

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> values(size_t(t.numel()));
  if (t.dtype == DType::f32) {
    std::memcpy(values.data(), t.data, t.bytes());
  } else {
    const auto* bits = static_cast<const uint16_t*>(t.data);
    for (size_t i = 0; i < values.size(); ++i) values[i] = bf16_to_float(bits[i]);
  }
  return values;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The emulated device's timeline. It runs each operation inside the call that enqueues it, so
// it reaches every phase mark as the host issues it, and it is busy exactly while an operation
// runs.
class HostTimeline final : public DeviceTimeline {
 public:
  void open(const char* phase, Clock::time_point issued) override {
    open_.push_back({phase, open_.empty() ? nullptr : open_.back().phase, issued, {}});
  }
  void close(Clock::time_point issued) override {
    if (open_.empty()) return;
    closed_.push_back(open_.back());
    closed_.back().end = issued;
    open_.pop_back();
  }
  DeviceRecord take(Clock::time_point origin) override {
    DeviceRecord record;
    for (const Span& span : closed_)
      record.spans.push_back({span.phase, span.parent, Profiler::kDeviceTrack,
                              seconds_between(origin, span.begin),
                              seconds_between(origin, span.end), 0});
    for (const auto& [begin, end] : busy_)
      record.busy.emplace_back(seconds_between(origin, begin), seconds_between(origin, end));
    record.launches = launches_;
    closed_.clear();
    busy_.clear();
    launches_ = 0;
    return record;
  }
  // One operation ran from begin to end.
  void ran(Clock::time_point begin, Clock::time_point end) {
    busy_.emplace_back(begin, end);
    ++launches_;
  }

 private:
  struct Span {
    const char* phase;
    const char* parent;
    Clock::time_point begin, end;
  };
  std::vector<Span> open_, closed_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> busy_;
  int64_t launches_ = 0;
};

// An operation of the emulated device, from construction to destruction.
class Operation {
 public:
  explicit Operation(HostTimeline& timeline) : timeline_(timeline) {}
  ~Operation() { timeline_.ran(begin_, Clock::now()); }
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

 private:
  HostTimeline& timeline_;
  Clock::time_point begin_ = Clock::now();
};

class EmulatedCudaBackend final : public Backend {
 public:
  EmulatedCudaBackend() : Backend(0) { profiler().set_device_timeline(&timeline_); }
  ~EmulatedCudaBackend() override { profiler().set_device_timeline(nullptr); }

  std::string name() const override { return "cuda (emulated on the host)"; }
  BackendKind kind() const override { return BackendKind::cuda; }
  DType compute_dtype() const override { return compute_dtype_of(BackendKind::cuda); }
  void set_num_threads(int) override {}

  void* raw_alloc(size_t bytes) override {
    return ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t(64));
  }
  void raw_free(void* pointer) override { ::operator delete(pointer, std::align_val_t(64)); }
  void synchronize() override {}

 private:
  // The kernel launches of kernels/cuda/*.cu, each an operation of the emulated device.
  template <typename Shape>
  void launch(const Shape& shape, const std::function<void()>& body) {
    const Operation operation(timeline_);
    cuda::emulation::launch(shape, body);
  }
  // As cuda::emulation::HostLaunch, through launch above.
  struct TimedLaunch {
    EmulatedCudaBackend* backend;
    template <typename Shape, typename Kernel, typename... Args>
    void operator()(const Shape& shape, Kernel kernel, Args... args) const {
      backend->launch(shape, [&] { kernel(args...); });
    }
  };

  void upload_impl(const Tensor& dst, const void* host_src) override {
    if (dst.bytes() == 0) return;
    const Operation operation(timeline_);
    std::memcpy(dst.data, host_src, dst.bytes());
  }
  void download_impl(void* host_dst, const Tensor& src) override {
    if (src.bytes() == 0) return;
    const Operation operation(timeline_);
    std::memcpy(host_dst, src.data, src.bytes());
  }
  void copy_impl(const Tensor& dst, const Tensor& src) override {
    if (dst.bytes() == 0 || dst.data == src.data) return;
    const Operation operation(timeline_);
    std::memcpy(dst.data, src.data, dst.bytes());
  }
  void fill_zero_impl(const Tensor& dst) override {
    if (dst.bytes() == 0) return;
    const Operation operation(timeline_);
    std::memset(dst.data, 0, dst.bytes());
  }
  void copy_2d_impl(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                    int64_t row_bytes, int64_t rows) override {
    const Operation operation(timeline_);
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(static_cast<char*>(dst) + row * dst_pitch,
                  static_cast<const char*>(src) + row * src_pitch, size_t(row_bytes));
  }

  void cast_impl(const Tensor& dst, const Tensor& src) override {
    const int64_t n = src.numel();
    if (dst.dtype == src.dtype) return copy(dst, src);
    if (n == 0) return;
    const cuda::LaunchShape shape = cuda::elementwise_launch(n);
    if (src.dtype == DType::f32)
      launch(shape, [&] { cuda::cast_kernel(data_of<bf16>(dst), data_of<const float>(src), n); });
    else
      launch(shape, [&] { cuda::cast_kernel(data_of<float>(dst), data_of<const bf16>(src), n); });
  }

  void axpy_impl(const Tensor& y, const Tensor& x, float alpha) override {
    const int64_t n = y.numel();
    if (n == 0) return;
    dispatch_float(y, [&](auto y_tag) {
      using TY = decltype(y_tag);
      dispatch_float(x, [&](auto x_tag) {
        using TX = decltype(x_tag);
        launch(cuda::elementwise_launch(n),
               [&] { cuda::axpy_kernel(data_of<TY>(y), data_of<const TX>(x), alpha, n); });
      });
    });
  }

  void scale_impl(const Tensor& x, float alpha) override {
    const int64_t n = x.numel();
    if (n == 0) return;
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(n), [&] { cuda::scale_kernel(data_of<T>(x), alpha, n); });
    });
  }

  double sum_squares_impl(const Tensor& x) override {
    const int64_t n = x.numel();
    if (n == 0) return 0.0;
    const int blocks = cuda::sum_squares_blocks(n);
    std::vector<double> partial(size_t(blocks) + 1, NAN);
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      cuda::sum_squares_passes(TimedLaunch{this}, partial.data(), data_of<const T>(x), n);
    });
    return partial[size_t(blocks)];
  }

  // cuBLASLt's part, on the cpu backend in f32; a bf16 c is rounded once at the end.
  void gemm_impl(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                 float alpha, float beta) override {
    const Operation operation(timeline_);
    std::vector<float> a32 = as_f32(a), b32 = as_f32(b), c32 = as_f32(c);
    const Tensor a_view(a32.data(), DType::f32, {a.shape[0], a.shape[1]});
    const Tensor b_view(b32.data(), DType::f32, {b.shape[0], b.shape[1]});
    const Tensor c_view(c32.data(), DType::f32, {c.shape[0], c.shape[1]});
    cpu_.gemm(a_view, trans_a, b_view, trans_b, c_view, alpha, beta);
    if (c.dtype == DType::f32) {
      std::memcpy(c.data, c32.data(), c.bytes());
    } else {
      auto* bits = static_cast<uint16_t*>(c.data);
      for (size_t i = 0; i < c32.size(); ++i) bits[i] = float_to_bf16(c32[i]);
    }
  }

  void bias_forward_impl(const Tensor& out, const Tensor& bias) override {
    const int64_t width = bias.numel(), rows = out.numel() / width;
    if (rows == 0) return;
    dispatch_float(out, [&](auto out_tag) {
      using T = decltype(out_tag);
      dispatch_float(bias, [&](auto bias_tag) {
        using TB = decltype(bias_tag);
        launch(cuda::elementwise_launch(rows * width), [&] {
          cuda::bias_forward_kernel(data_of<T>(out), data_of<const TB>(bias), rows, width);
        });
      });
    });
  }

  void bias_backward_impl(const Tensor& dbias, const Tensor& dout) override {
    const int64_t width = dbias.numel(), rows = dout.numel() / width;
    if (rows == 0) return;
    const cuda::ColumnChunks chunks = cuda::column_chunks(rows);
    Buffer parts = alloc(MemCategory::workspace, DType::f32, {chunks.chunks, width}, "parts");
    dispatch_float(dout, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::column_partials_launch(width, chunks), [&] {
        cuda::column_partials_kernel<cuda::ColumnTerm::value, T>(
            parts.f32(), data_of<const T>(dout), nullptr, nullptr, nullptr, rows, width,
            chunks.rows_per_chunk);
      });
    });
    reduce_columns(dbias.f32(), parts.f32(), chunks.chunks, width);
  }

  void embedding_forward_impl(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                              const Tensor& wpe, int64_t pos_offset) override {
    const int64_t width = wte.shape[1], n = tokens.numel();
    const int64_t seq_len = tokens.shape[tokens.ndim - 1];
    if (n == 0) return;
    dispatch_float(wte, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(n * width), [&] {
        cuda::embedding_forward_kernel(data_of<T>(out), tokens.i32(), data_of<const T>(wte),
                                       wpe.empty() ? nullptr : data_of<const T>(wpe), n, width,
                                       seq_len, pos_offset);
      });
    });
  }

  void embedding_backward_impl(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                               const Tensor& tokens, int64_t pos_offset) override {
    const int64_t vocab = dwte.shape[0], width = dwte.shape[1], n = tokens.numel();
    const int64_t seq_len = tokens.shape[tokens.ndim - 1];
    if (n == 0) return;
    const std::vector<int32_t> ids(tokens.i32(), tokens.i32() + n);
    const cuda::EmbeddingBackwardPlan plan = cuda::embedding_backward_plan(ids, vocab);
    const int32_t* order = plan.data.data();
    const int32_t* starts = order + n;
    const int32_t* segment_ids = starts + plan.segments + 1;
    dispatch_float(dout, [&](auto tag) {
      using T = decltype(tag);
      const T* g = data_of<const T>(dout);
      launch(cuda::block_per_row_launch(plan.segments), [&] {
        cuda::embedding_backward_kernel(dwte.f32(), g, order, starts, segment_ids, width);
      });
      if (!dwpe.empty())
        launch(cuda::elementwise_launch(seq_len * width), [&] {
          cuda::position_backward_kernel(dwpe.f32(), g, n / seq_len, seq_len, width, pos_offset);
        });
    });
  }

  void rmsnorm_forward_impl(const Tensor& out, const Tensor& rstd, const Tensor& x,
                            const Tensor& weight, float eps) override {
    const int64_t width = weight.numel(), rows = x.numel() / width;
    if (rows == 0) return;
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::block_per_row_launch(rows), [&] {
        cuda::rmsnorm_forward_kernel(data_of<T>(out), rstd.f32(), data_of<const T>(x),
                                     data_of<const T>(weight), width, eps);
      });
    });
  }

  void rmsnorm_backward_impl(const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                             const Tensor& x, const Tensor& weight, const Tensor& rstd) override {
    const int64_t width = weight.numel(), rows = x.numel() / width;
    if (rows == 0) return;
    const cuda::ColumnChunks chunks = cuda::column_chunks(rows);
    Buffer parts = alloc(MemCategory::workspace, DType::f32, {chunks.chunks, width}, "parts");
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::column_partials_launch(width, chunks), [&] {
        cuda::column_partials_kernel<cuda::ColumnTerm::times_rms_input, T>(
            parts.f32(), data_of<const T>(dout), data_of<const T>(x), nullptr, rstd.f32(), rows,
            width, chunks.rows_per_chunk);
      });
      launch(cuda::block_per_row_launch(rows), [&] {
        cuda::rmsnorm_backward_kernel(data_of<T>(dx), data_of<const T>(dout), data_of<const T>(x),
                                      data_of<const T>(weight), rstd.f32(), width);
      });
    });
    reduce_columns(dweight.f32(), parts.f32(), chunks.chunks, width);
  }

  void layernorm_forward_impl(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                              const Tensor& x, const Tensor& weight, const Tensor& bias,
                              float eps) override {
    const int64_t width = weight.numel(), rows = x.numel() / width;
    if (rows == 0) return;
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::block_per_row_launch(rows), [&] {
        cuda::layernorm_forward_kernel(data_of<T>(out), mean.f32(), rstd.f32(), data_of<const T>(x),
                                       data_of<const T>(weight), data_of<const T>(bias), width,
                                       eps);
      });
    });
  }

  void layernorm_backward_impl(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                               const Tensor& dout, const Tensor& x, const Tensor& weight,
                               const Tensor& mean, const Tensor& rstd) override {
    const int64_t width = weight.numel(), rows = x.numel() / width;
    if (rows == 0) return;
    const cuda::ColumnChunks chunks = cuda::column_chunks(rows);
    Buffer parts = alloc(MemCategory::workspace, DType::f32, {2, chunks.chunks, width}, "parts");
    float* weight_parts = parts.f32();
    float* bias_parts = weight_parts + chunks.chunks * width;
    const cuda::LaunchShape columns = cuda::column_partials_launch(width, chunks);
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      const T* g = data_of<const T>(dout);
      const T* in = data_of<const T>(x);
      launch(columns, [&] {
        cuda::column_partials_kernel<cuda::ColumnTerm::times_normed_input, T>(
            weight_parts, g, in, mean.f32(), rstd.f32(), rows, width, chunks.rows_per_chunk);
      });
      launch(columns, [&] {
        cuda::column_partials_kernel<cuda::ColumnTerm::value, T>(
            bias_parts, g, nullptr, nullptr, nullptr, rows, width, chunks.rows_per_chunk);
      });
      launch(cuda::block_per_row_launch(rows), [&] {
        cuda::layernorm_backward_kernel(data_of<T>(dx), g, in, data_of<const T>(weight), mean.f32(),
                                        rstd.f32(), width);
      });
    });
    reduce_columns(dweight.f32(), weight_parts, chunks.chunks, width);
    reduce_columns(dbias.f32(), bias_parts, chunks.chunks, width);
  }

  void rope_impl(const Tensor& x, int64_t pos_offset, float theta, bool inverse) override {
    const int64_t batch = x.shape[0], seq_len = x.shape[1], heads = x.shape[2];
    const int64_t half = x.shape[3] / 2, dim = x.shape[3];
    if (x.numel() == 0) return;
    Buffer table = rope_table(*this, seq_len, half);
    float* cos_table = table.f32();
    float* sin_table = cos_table + seq_len * half;
    launch(cuda::elementwise_launch(seq_len * half), [&] {
      cuda::rope_table_kernel(cos_table, sin_table, seq_len, half, dim, pos_offset, double(theta),
                              inverse ? -1.0 : 1.0);
    });
    const int64_t rows = batch * seq_len * heads;
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(rows * half), [&] {
        cuda::rope_apply_kernel(data_of<T>(x), cos_table, sin_table, rows, seq_len, heads, half);
      });
    });
  }

  void swiglu_forward_impl(const Tensor& out, const Tensor& gate, const Tensor& up) override {
    const int64_t n = out.numel();
    if (n == 0) return;
    dispatch_float(gate, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(n), [&] {
        cuda::swiglu_forward_kernel(data_of<T>(out), data_of<const T>(gate), data_of<const T>(up),
                                    n);
      });
    });
  }

  void swiglu_backward_impl(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                            const Tensor& gate, const Tensor& up) override {
    const int64_t n = dout.numel();
    if (n == 0) return;
    dispatch_float(gate, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(n), [&] {
        cuda::swiglu_backward_kernel(data_of<T>(dgate), data_of<T>(dup), data_of<const T>(dout),
                                     data_of<const T>(gate), data_of<const T>(up), n);
      });
    });
  }

  void gelu_forward_impl(const Tensor& out, const Tensor& x) override {
    const int64_t n = x.numel();
    if (n == 0) return;
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(n),
             [&] { cuda::gelu_forward_kernel(data_of<T>(out), data_of<const T>(x), n); });
    });
  }

  void gelu_backward_impl(const Tensor& dx, const Tensor& dout, const Tensor& x) override {
    const int64_t n = x.numel();
    if (n == 0) return;
    dispatch_float(x, [&](auto tag) {
      using T = decltype(tag);
      launch(cuda::elementwise_launch(n), [&] {
        cuda::gelu_backward_kernel(data_of<T>(dx), data_of<const T>(dout), data_of<const T>(x), n);
      });
    });
  }

  // The kernels, launch shapes and block scratch kernels/cuda/cuda_attention.cu chooses:
  // tensor cores where mma_attention_fits, else the FMA kernels.
  void attention_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                              const Tensor& k, const Tensor& v,
                              const Documents& documents) override {
    attention_into(out, lse, q, k, v, 0, 0, documents);
  }

  void attention_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse,
                               const Documents& documents) override {
    attention_gradients_into(dq, dk, dv, dout, q, k, v, out, lse, 0, 0, documents);
  }

  void attention_block_forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q,
                                    const Tensor& k, const Tensor& v, int64_t q_first,
                                    int64_t k_first, bool merge,
                                    const Documents& documents) override {
    using namespace cuda_attention;
    if (!merge) return attention_into(out, lse, q, k, v, q_first, k_first, documents);
    if (q.numel() == 0) return;
    const AttentionDims dims = attention_dims(q, k);
    const AttentionBlockOutputs block = attention_block_outputs(*this, out, lse);
    const Tensor block_out = block.out.tensor(), block_lse = block.lse.tensor();
    attention_into(block_out, block_lse, q, k, v, q_first, k_first, documents);
    const int64_t rows = q.shape[0] * dims.seq_len * dims.q_heads;
    launch(attention_merge_launch(rows), [&] {
      attention_merge_kernel(data_of<bf16>(out), lse.f32(), data_of<const bf16>(block_out),
                             block_lse.f32(), dims, rows);
    });
  }

  void attention_block_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                     const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     int64_t q_first, int64_t k_first,
                                     const Documents& documents) override {
    if (q.numel() == 0) return;
    const AttentionBlockGradients block = attention_block_gradients(*this, dq, dk, dv);
    const Tensor block_dq = block.dq.tensor().reshape({dq.dim(0), dq.dim(1), dq.dim(2), dq.dim(3)});
    const Tensor block_dk = block.dk.tensor().reshape({dk.dim(0), dk.dim(1), dk.dim(2), dk.dim(3)});
    const Tensor block_dv = block.dv.tensor().reshape({dv.dim(0), dv.dim(1), dv.dim(2), dv.dim(3)});
    attention_gradients_into(block_dq, block_dk, block_dv, dout, q, k, v, out, lse, q_first,
                             k_first, documents);
    axpy(dq, block_dq, 1.0f);
    axpy(dk, block_dk, 1.0f);
    axpy(dv, block_dv, 1.0f);
  }

  void attention_into(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                      const Tensor& v, int64_t q_first, int64_t k_first,
                      const Documents& documents) {
    using namespace cuda_attention;
    if (q.numel() == 0) return;
    const AttentionDims dims = attention_dims(q, k);
    const std::vector<int32_t> words = document_mask_words(documents);
    const AttentionMask mask =
        attention_mask_at(words.empty() ? nullptr : words.data(), q_first, k_first);
    const bool tensor_cores = mma_attention_fits(dims.dim, q.data, k.data, v.data, q.data);
    const cuda::LaunchShape shape = tensor_cores ? attention_forward_mma_launch(dims, q.shape[0])
                                                 : attention_forward_launch(dims, q.shape[0]);
    auto run = [&](auto kernel) {
      launch(shape, [&] {
        kernel(data_of<bf16>(out), lse.f32(), data_of<const bf16>(q), data_of<const bf16>(k),
               data_of<const bf16>(v), dims, mask);
      });
    };
    const bool narrow = kernel_dim(dims.dim) == 64;
    if (tensor_cores)
      run(narrow ? attention_forward_mma_kernel<64> : attention_forward_mma_kernel<128>);
    else
      run(narrow ? attention_forward_kernel<64> : attention_forward_kernel<128>);
  }

  void attention_gradients_into(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const Tensor& dout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& out, const Tensor& lse,
                                int64_t q_first, int64_t k_first, const Documents& documents) {
    using namespace cuda_attention;
    if (q.numel() == 0) return;
    const AttentionDims dims = attention_dims(q, k);
    const std::vector<int32_t> words = document_mask_words(documents);
    const AttentionMask mask =
        attention_mask_at(words.empty() ? nullptr : words.data(), q_first, k_first);
    const int64_t batch = q.shape[0];
    Buffer row_dot = attention_row_dot(*this, batch, dims.q_heads, dims.seq_len);
    const int64_t rows = batch * dims.seq_len * dims.q_heads;
    launch(attention_row_dot_launch(rows), [&] {
      attention_row_dot_kernel(row_dot.f32(), data_of<const bf16>(dout), data_of<const bf16>(out),
                               dims, rows);
    });
    const bool tensor_cores = mma_attention_fits(dims.dim, q.data, k.data, v.data, dout.data);
    auto run = [&](auto dq_kernel, auto dkv_kernel) {
      launch(tensor_cores ? attention_dq_mma_launch(dims, batch) : attention_dq_launch(dims, batch),
             [&] {
               dq_kernel(data_of<bf16>(dq), data_of<const bf16>(dout), data_of<const bf16>(q),
                         data_of<const bf16>(k), data_of<const bf16>(v), lse.f32(), row_dot.f32(),
                         dims, mask);
             });
      launch(
          tensor_cores ? attention_dkv_mma_launch(dims, batch) : attention_dkv_launch(dims, batch),
          [&] {
            dkv_kernel(data_of<bf16>(dk), data_of<bf16>(dv), data_of<const bf16>(dout),
                       data_of<const bf16>(q), data_of<const bf16>(k), data_of<const bf16>(v),
                       lse.f32(), row_dot.f32(), dims, mask);
          });
    };
    const bool narrow = kernel_dim(dims.dim) == 64;
    if (tensor_cores && narrow)
      run(attention_dq_mma_kernel<64>, attention_dkv_mma_kernel<64>);
    else if (tensor_cores)
      run(attention_dq_mma_kernel<128>, attention_dkv_mma_kernel<128>);
    else if (narrow)
      run(attention_dq_kernel<64>, attention_dkv_kernel<64>);
    else
      run(attention_dq_kernel<128>, attention_dkv_kernel<128>);
  }

  LossResult lm_head_loss_impl(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                               int64_t tile_rows, float grad_scale, const Tensor& dhidden,
                               const Tensor& dweight) override {
    LossResult result;
    dispatch_float(hidden, [&](auto tag) {
      result =
          cuda::lm_head_loss_tiles<decltype(tag)>(*this, TimedLaunch{this}, hidden, weight, targets,
                                                  tile_rows, grad_scale, dhidden, dweight);
    });
    return result;
  }

  void adamw_impl(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const AdamWStep& step) override {
    const int64_t n = param.numel();
    if (n == 0) return;
    const formulas::AdamWScalars s = formulas::adamw_scalars(step);
    launch(cuda::elementwise_launch(n),
           [&] { cuda::adamw_kernel(param.f32(), grad.f32(), m.f32(), v.f32(), s, n); });
  }

  static cuda_attention::AttentionDims attention_dims(const Tensor& q, const Tensor& k) {
    return {q.shape[1], int(q.shape[2]), int(k.shape[2]), int(q.shape[3]),
            float(1.0 / std::sqrt(double(q.shape[3])))};
  }

  void reduce_columns(float* dst, const float* parts, int64_t chunks, int64_t width) {
    launch(cuda::add_column_partials_launch(width),
           [&] { cuda::add_column_partials_kernel(dst, parts, chunks, width); });
  }

  CpuBackend cpu_;
  HostTimeline timeline_;
};

}  // namespace

std::unique_ptr<Backend> make_emulated_cuda_backend() {
  return std::make_unique<EmulatedCudaBackend>();
}

}  // namespace ulysses
