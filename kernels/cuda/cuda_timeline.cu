#include <algorithm>
#include <chrono>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_timeline.cuh"

namespace ulysses {

using cuda::check_cuda;

namespace {

double seconds_between(DeviceTimeline::Clock::time_point from,
                       DeviceTimeline::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

CudaTimeline::~CudaTimeline() {
  // Destructors cannot throw: statuses are ignored on the way out. An event still pending on
  // another stream is released when it completes.
  cudaStreamSynchronize(stream_);
  for (const Span& span : open_) cudaEventDestroy(span.begin.event);
  for (const Span& span : closed_) {
    cudaEventDestroy(span.begin.event);
    cudaEventDestroy(span.end.event);
  }
  for (cudaEvent_t event : free_events_) cudaEventDestroy(event);
}

cudaEvent_t CudaTimeline::acquire_event() {
  if (!free_events_.empty()) {
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreate(&event), "cudaEventCreate (device timeline)");
  return event;
}

void CudaTimeline::open(const char* phase, Clock::time_point issued) {
  const Mark begin{acquire_event(), issued};
  const cudaError_t status = cudaEventRecord(begin.event, stream_);
  if (status != cudaSuccess) {
    free_events_.push_back(begin.event);
    check_cuda(status, "cudaEventRecord (device timeline)");
  }
  const char* parent = open_.empty() ? nullptr : open_.back().name;
  open_.push_back({phase, parent, Profiler::kDeviceTrack, begin, Mark{}, 0});
}

void CudaTimeline::close(Clock::time_point issued) {
  if (open_.empty()) return;
  Span span = open_.back();
  open_.pop_back();
  // An event that cannot be had leaves the span out; the stream's error, if any, is reported
  // by the next operation that checks it.
  if (free_events_.empty()) {
    cudaEvent_t event = nullptr;
    if (cudaEventCreate(&event) != cudaSuccess) {
      free_events_.push_back(span.begin.event);
      return;
    }
    free_events_.push_back(event);
  }
  span.end = {free_events_.back(), issued};
  free_events_.pop_back();
  cudaEventRecord(span.end.event, stream_);
  closed_.push_back(span);
}

void CudaTimeline::add_span(int track, const char* name, cudaEvent_t begin, cudaEvent_t end,
                            int64_t bytes) {
  closed_.push_back({name, nullptr, track, {begin, {}}, {end, {}}, bytes});
}

double CudaTimeline::reached(cudaEvent_t event, cudaEvent_t anchor, double anchor_issued) const {
  float before_anchor_ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&before_anchor_ms, event, anchor),
             "cudaEventElapsedTime (device timeline)");
  return anchor_issued - double(before_anchor_ms) * 1e-3;
}

DeviceRecord CudaTimeline::take(Clock::time_point origin) {
  DeviceRecord record;
  const int64_t enqueued = cuda::enqueued_operations.load(std::memory_order_relaxed);
  record.launches = enqueued - enqueued_at_take_;
  enqueued_at_take_ = enqueued;
  if (closed_.empty()) return record;
  // The other streams' spans end before the anchor, so that every event precedes it.
  for (const Span& span : closed_)
    if (span.track != Profiler::kDeviceTrack)
      check_cuda(cudaEventSynchronize(span.end.event), "cudaEventSynchronize (device timeline)");
  // The anchor ties the device's clock to the host's: the stream has finished the step, so
  // the device reaches it as soon as it is issued.
  cudaEvent_t anchor = acquire_event();
  const Clock::time_point anchor_issued = Clock::now();
  cudaError_t status = cudaEventRecord(anchor, stream_);
  if (status == cudaSuccess) status = cudaEventSynchronize(anchor);
  if (status != cudaSuccess) {
    free_events_.push_back(anchor);
    check_cuda(status, "waiting for the device (device timeline)");
  }
  const double anchor_seconds = seconds_between(origin, anchor_issued);

  std::vector<std::pair<double, double>> placed;  // reached: begin, end
  placed.reserve(closed_.size());
  double least_lag = 0.0;
  for (const Span& span : closed_) {
    placed.emplace_back(reached(span.begin.event, anchor, anchor_seconds),
                        reached(span.end.event, anchor, anchor_seconds));
    if (span.track != Profiler::kDeviceTrack) continue;
    least_lag =
        std::min({least_lag, placed.back().first - seconds_between(origin, span.begin.issued),
                  placed.back().second - seconds_between(origin, span.end.issued)});
  }
  // The anchor was reached some latency after its issue. A mark reached sooner after its own
  // issue shows that latency: the device's times move later by it, so that no mark is reached
  // before it was issued and the quickest counts as an idle stream.
  const double shift = -least_lag;

  record.spans.reserve(closed_.size());
  record.busy.reserve(2 * closed_.size());
  for (size_t i = 0; i < closed_.size(); ++i) {
    const Span& span = closed_[i];
    const double begin = placed[i].first + shift, end = placed[i].second + shift;
    record.spans.push_back({span.name, span.parent, span.track, begin, end, span.bytes});
    if (span.track == Profiler::kDeviceTrack) {
      // From a mark's issue until the device reached it, the stream had work ahead of it.
      record.busy.emplace_back(seconds_between(origin, span.begin.issued), begin);
      record.busy.emplace_back(seconds_between(origin, span.end.issued), end);
    } else {
      record.busy.emplace_back(begin, end);
    }
    free_events_.push_back(span.begin.event);
    free_events_.push_back(span.end.event);
  }
  free_events_.push_back(anchor);
  closed_.clear();
  return record;
}

}  // namespace ulysses
