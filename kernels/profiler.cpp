#include "kernels/profiler.h"

#include <utility>

namespace ulysses {

void Profiler::reset_origin() {
  origin_ = std::chrono::steady_clock::now();
  if (device_) device_->reset_origin();
}

double Profiler::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
}

Profiler::Scope::Scope(Profiler& profiler, const char* phase, Kind kind, int64_t bytes,
                       double flops)
    : profiler_(profiler), open_(profiler.push(phase, kind, bytes, flops)) {}

Profiler::Scope::~Scope() {
  if (open_) profiler_.pop();
}

bool Profiler::push(const char* phase, Kind kind, int64_t bytes, double flops) {
  for (const Open& open : stack_) {
    if (open.kind == Kind::absorbing && kind != Kind::communication) {
      // Charged to the absorbing phase; its bytes and FLOPs still count there.
      stack_.back().bytes += bytes;
      stack_.back().flops += flops;
      return false;
    }
  }
  const bool on_device = trace_ && device_;
  stack_.push_back({phase, now(), 0.0, bytes, flops, kind, on_device});
  if (open_range_) open_range_(phase);
  if (on_device) device_->open(phase);
  return true;
}

void Profiler::pop() {
  if (close_range_) close_range_();
  const Open open = stack_.back();
  if (open.on_device) device_->close();
  stack_.pop_back();
  const double end = now(), elapsed = end - open.begin;
  PhaseTotals& totals = totals_[open.phase];
  totals.seconds += elapsed - open.child_seconds;
  totals.bytes += open.bytes;
  totals.flops += open.flops;
  totals.count += 1;
  if (!stack_.empty()) stack_.back().child_seconds += elapsed;
  if (trace_)
    trace_spans_.push_back(
        {open.phase, open.begin * 1e6, elapsed * 1e6, kComputeTrack, open.bytes, open.flops});
}

void Profiler::record_in_flight(const std::string& name, double begin, double end, int64_t bytes) {
  PhaseTotals& totals = totals_[name];
  totals.seconds += end - begin;
  totals.bytes += bytes;
  totals.count += 1;
  if (trace_)
    trace_spans_.push_back({name, begin * 1e6, (end - begin) * 1e6, kCommTrack, bytes, 0.0});
}

std::map<std::string, PhaseTotals> Profiler::take_totals() {
  return std::exchange(totals_, {});
}

std::vector<TraceSpan> Profiler::take_trace() {
  std::vector<TraceSpan> spans = std::exchange(trace_spans_, {});
  if (device_) {
    std::vector<TraceSpan> device_spans = device_->take();
    spans.insert(spans.end(), device_spans.begin(), device_spans.end());
  }
  return spans;
}

}  // namespace ulysses
