#include "core/model/unit_pipeline.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace ulysses {

namespace {

std::vector<int> without_repeats(const std::vector<int>& plan) {
  std::vector<int> uses;
  for (int unit : plan)
    if (uses.empty() || uses.back() != unit) uses.push_back(unit);
  return uses;
}

}  // namespace

WeightPipeline::WeightPipeline(ZeroState& state, std::vector<int> plan, int lookahead)
    : state_(state), plan_(without_repeats(plan)), lookahead_(lookahead) {}

WeightPipeline::~WeightPipeline() {
  ahead_.reset();  // a gather in flight completes before its slot is released
  if (ahead_unit_ >= 0) state_.release(ahead_unit_);
  if (current_ >= 0) state_.release(current_);
}

void WeightPipeline::take(int unit) {
  if (unit == current_) return;
  if (next_ >= plan_.size() || plan_[next_] != unit)
    throw std::logic_error("WeightPipeline: unit " + std::to_string(unit) +
                           " taken out of the plan's order");
  ++next_;
  if (current_ >= 0) state_.release(current_);
  current_ = unit;
  if (ahead_unit_ == unit) {
    if (ahead_) ahead_->wait();
    ahead_.reset();
    ahead_unit_ = -1;
  } else {
    CommHandle gather = state_.start_gather(unit);
    if (gather) gather->wait();
  }
  if (lookahead_ > 0 && next_ < plan_.size()) {
    ahead_unit_ = plan_[next_];
    ahead_ = state_.start_gather(ahead_unit_);
  }
}

void WeightPipeline::finish() {
  if (current_ >= 0) state_.release(current_);
  current_ = -1;
}

GradientPipeline::GradientPipeline(ZeroState& state) : state_(state) {}

GradientPipeline::~GradientPipeline() {
  in_flight_.clear();  // each handle waits as it goes
}

void GradientPipeline::take(int unit) {
  if (unit == current_) return;
  if (current_ >= 0) {
    CommHandle reduction = state_.start_reduction(current_);
    if (reduction) in_flight_.push_back(std::move(reduction));
  }
  // Each reduction in flight holds a staging slot until it is waited for.
  while (!in_flight_.empty() && int(in_flight_.size()) >= state_.slots()) {
    in_flight_.front()->wait();
    in_flight_.pop_front();
  }
  state_.begin_gradients(unit);
  current_ = unit;
}

void GradientPipeline::finish() {
  if (current_ >= 0) {
    CommHandle reduction = state_.start_reduction(current_);
    if (reduction) in_flight_.push_back(std::move(reduction));
  }
  current_ = -1;
  while (!in_flight_.empty()) {
    in_flight_.front()->wait();
    in_flight_.pop_front();
  }
}

}  // namespace ulysses
