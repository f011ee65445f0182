#include "kernels/profiler.h"

#include <algorithm>
#include <utility>

namespace ulysses {

namespace {

double seconds_between(std::chrono::steady_clock::time_point from,
                       std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Sorted, disjoint intervals covering the same time as the given ones.
std::vector<std::pair<double, double>> merged(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& [begin, end] : intervals) {
    if (end <= begin) continue;
    if (!out.empty() && begin <= out.back().second) {
      out.back().second = std::max(out.back().second, end);
    } else {
      out.emplace_back(begin, end);
    }
  }
  return out;
}

// How much of [begin, end) the sorted, disjoint intervals cover.
double covered(const std::vector<std::pair<double, double>>& intervals, double begin, double end) {
  auto it =
      std::partition_point(intervals.begin(), intervals.end(),
                           [&](const std::pair<double, double>& x) { return x.second <= begin; });
  double total = 0.0;
  for (; it != intervals.end() && it->first < end; ++it)
    total += std::min(it->second, end) - std::max(it->first, begin);
  return total;
}

}  // namespace

void Profiler::reset_origin() {
  origin_ = std::chrono::steady_clock::now();
}

double Profiler::now() const {
  return seconds_between(origin_, std::chrono::steady_clock::now());
}

void Profiler::set_device_timing(bool on) {
  if (!on && device_timing()) device_->take(origin_);
  device_timing_ = on;
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
  const auto issued = std::chrono::steady_clock::now();
  const bool on_device = device_timing();
  if (on_device) device_->open(phase, issued);  // first: if it throws, nothing is open
  stack_.push_back({phase, seconds_between(origin_, issued), 0.0, bytes, flops, kind, on_device});
  if (open_range_) open_range_(phase);
  return true;
}

void Profiler::pop() {
  if (close_range_) close_range_();
  const Open open = stack_.back();
  stack_.pop_back();
  const auto issued = std::chrono::steady_clock::now();
  if (open.on_device) device_->close(issued);
  const double end = seconds_between(origin_, issued), elapsed = end - open.begin;
  PhaseTotals& totals = totals_.phases[open.phase];
  totals.host_seconds += elapsed - open.child_seconds;
  // On the device its seconds arrive with the timeline's spans (collect_device).
  if (!open.on_device) totals.seconds += elapsed - open.child_seconds;
  totals.bytes += open.bytes;
  totals.flops += open.flops;
  totals.count += 1;
  if (!stack_.empty()) stack_.back().child_seconds += elapsed;
  if (trace_)
    trace_spans_.push_back(
        {open.phase, open.begin * 1e6, elapsed * 1e6, kComputeTrack, open.bytes, open.flops});
}

void Profiler::record_in_flight(const std::string& name, double begin, double end, int64_t bytes) {
  PhaseTotals& totals = totals_.phases[name];
  totals.seconds += end - begin;
  totals.host_seconds += end - begin;
  totals.bytes += bytes;
  totals.count += 1;
  if (trace_)
    trace_spans_.push_back({name, begin * 1e6, (end - begin) * 1e6, kCommTrack, bytes, 0.0});
}

void Profiler::collect_device() {
  if (!device_timing()) return;
  DeviceRecord record = device_->take(origin_);
  const std::vector<std::pair<double, double>> busy = merged(std::move(record.busy));
  totals_.device_timed = true;
  totals_.launches += record.launches;
  for (const auto& [begin, end] : busy) totals_.device_busy_seconds += end - begin;
  for (const DeviceSpan& span : record.spans) {
    const double seconds = span.end - span.begin;
    if (span.track == kDeviceTrack) {
      // Self time as on the host: a span's time is its own less the spans nested in it.
      const double busy_seconds = covered(busy, span.begin, span.end);
      PhaseTotals& phase = totals_.phases[span.name];
      phase.seconds += seconds;
      phase.busy_seconds += busy_seconds;
      if (span.parent) {
        PhaseTotals& parent = totals_.phases[span.parent];
        parent.seconds -= seconds;
        parent.busy_seconds -= busy_seconds;
      }
    } else {
      PhaseTotals& row =
          totals_.phases[span.track == kDeviceCollectiveTrack ? phase::kCollectivesStream
                                                              : phase::kTransferStream];
      row.seconds += seconds;
      row.busy_seconds += seconds;
      row.bytes += span.bytes;
      row.count += 1;
    }
    if (trace_)
      trace_spans_.push_back(
          {span.name, span.begin * 1e6, seconds * 1e6, span.track, span.bytes, 0.0});
  }
}

ProfileTotals Profiler::take_totals() {
  collect_device();
  return std::exchange(totals_, {});
}

std::vector<TraceSpan> Profiler::take_trace() {
  collect_device();
  return std::exchange(trace_spans_, {});
}

}  // namespace ulysses
