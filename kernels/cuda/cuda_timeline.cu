#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_timeline.cuh"

namespace ulysses {

using cuda::check_cuda;

CudaTimeline::~CudaTimeline() {
  // Destructors cannot throw: statuses are ignored on the way out.
  cudaStreamSynchronize(stream_);
  for (const Span& span : open_) cudaEventDestroy(span.begin);
  for (const Span& span : closed_) {
    cudaEventDestroy(span.begin);
    cudaEventDestroy(span.end);
  }
  for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
  if (origin_) cudaEventDestroy(origin_);
}

cudaEvent_t CudaTimeline::reuse_or_create_event() {
  if (!free_events_.empty()) {
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreate(&event), "cudaEventCreate (trace timeline)");
  return event;
}

void CudaTimeline::reset_origin() {
  if (!origin_) origin_ = reuse_or_create_event();
  check_cuda(cudaEventRecord(origin_, stream_), "cudaEventRecord (trace origin)");
}

void CudaTimeline::open(const char* phase) {
  // A trace taken before any origin is measured from the first phase.
  if (!origin_) reset_origin();
  cudaEvent_t begin = reuse_or_create_event();
  check_cuda(cudaEventRecord(begin, stream_), "cudaEventRecord (trace timeline)");
  open_.push_back({phase, begin, nullptr, Profiler::kDeviceTrack, 0});
}

void CudaTimeline::close() {
  if (open_.empty()) return;
  Span span = open_.back();
  open_.pop_back();
  // An event that cannot be had leaves the span out; the stream's error, if any, is reported
  // by the next operation that checks it.
  if (free_events_.empty()) {
    cudaEvent_t event = nullptr;
    if (cudaEventCreate(&event) != cudaSuccess) {
      free_events_.push_back(span.begin);
      return;
    }
    free_events_.push_back(event);
  }
  span.end = free_events_.back();
  free_events_.pop_back();
  cudaEventRecord(span.end, stream_);
  closed_.push_back(span);
}

void CudaTimeline::add_collective(const char* name, cudaEvent_t begin, cudaEvent_t end,
                                  int64_t bytes) {
  if (!origin_) reset_origin();
  closed_.push_back({name, begin, end, Profiler::kDeviceCollectiveTrack, bytes});
}

std::vector<TraceSpan> CudaTimeline::take() {
  std::vector<TraceSpan> spans;
  if (closed_.empty()) return spans;
  // Collectives' events were recorded on their own stream, which finished them before the
  // communicator handed them over; the backend's stream may still be running.
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (trace timeline)");
  spans.reserve(closed_.size());
  for (const Span& span : closed_) {
    float origin_to_begin_ms = 0.0f, begin_to_end_ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&origin_to_begin_ms, origin_, span.begin),
               "cudaEventElapsedTime (trace timeline)");
    check_cuda(cudaEventElapsedTime(&begin_to_end_ms, span.begin, span.end),
               "cudaEventElapsedTime (trace timeline)");
    TraceSpan out;
    out.name = span.name;
    out.begin_us = double(origin_to_begin_ms) * 1e3;
    out.duration_us = double(begin_to_end_ms) * 1e3;
    out.track = span.track;
    out.bytes = span.bytes;
    spans.push_back(out);
    free_events_.push_back(span.begin);
    free_events_.push_back(span.end);
  }
  closed_.clear();
  return spans;
}

}  // namespace ulysses
