// The ZeRO collectives of one pass of the step over the parameter units, in the order the
// schedule (core/model/model.cpp) uses the units (docs/profiling.md, "The step as one schedule"):
// weights are gathered ahead of their use (stage 3), gradients are reduced behind it (stages 2-3).
// With prefetch off (or one slot) each collective is issued and waited for where the unit is
// needed, as before the schedule existed; the arithmetic is the same either way.
#pragma once

#include <deque>
#include <vector>

#include "parallel/comm.h"
#include "parallel/zero_state.h"

namespace ulysses {

class WeightPipeline {
 public:
  // plan: the units in the order the pass uses them (consecutive repeats are one use).
  // lookahead 1: taking a unit starts the gather of the next one in the plan (needs two
  // gather slots); 0: a unit is gathered when it is taken.
  WeightPipeline(ZeroState& state, std::vector<int> plan, int lookahead);
  ~WeightPipeline();
  WeightPipeline(const WeightPipeline&) = delete;
  WeightPipeline& operator=(const WeightPipeline&) = delete;

  // Makes unit (the plan's next) the one whose weights the computation reads: releases the
  // unit before it, waits for its gather (starting it if it was not), then starts the
  // gather of the unit after it. Taking the current unit again does nothing.
  void take(int unit);
  // Releases the last unit (end of the pass).
  void finish();

 private:
  ZeroState& state_;
  std::vector<int> plan_;
  int lookahead_;
  size_t next_ = 0;  // index in plan_ of the next unit to take
  int current_ = -1;
  int ahead_unit_ = -1;  // whose gather is in flight
  CommHandle ahead_;
};

class GradientPipeline {
 public:
  // Reductions that may still travel while later units compute: ZeroState::slots() - 1.
  explicit GradientPipeline(ZeroState& state);
  ~GradientPipeline();
  GradientPipeline(const GradientPipeline&) = delete;
  GradientPipeline& operator=(const GradientPipeline&) = delete;

  // Makes unit the one whose gradients the computation accumulates: starts the reduction of
  // the unit before it, waits for older reductions while every staging slot is taken, and
  // stages unit. Taking the current unit again does nothing.
  void take(int unit);
  // Starts the last unit's reduction and waits for every reduction (end of a backward).
  void finish();

 private:
  ZeroState& state_;
  int current_ = -1;
  std::deque<CommHandle> in_flight_;
};

}  // namespace ulysses
