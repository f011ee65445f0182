#include "core/train/optimizer_step.h"

#include <cmath>

#include "core/train/nonfinite.h"
#include "kernels/profiler.h"
#include "parallel/watchdog.h"

namespace ulysses {

OptimizerStepResult take_optimizer_step(Model& model, AdamW& optimizer, DivergenceGuard& guard,
                                        Backend& backend, Comm& world, const TrainConfig& train,
                                        double loss, double lr, int64_t step) {
  Profiler& profiler = backend.profiler();
  OptimizerStepResult result;
  // ZeRO (parallel/zero_state.h): the reduced gradient and the master weights are whole or
  // this rank's shard; either way the norm is over the whole gradient, so clipping is exact.
  ZeroState& state = model.state();
  state.reduce_gradients();
  result.grad_norm = std::sqrt(state.gradient_norm_squared());
  const bool finite = std::isfinite(loss) && std::isfinite(result.grad_norm);
  std::string spike = finite ? guard.spike(loss) : "";
  // Both values are all-reduced, so every rank reaches the same verdict; it is agreed all the
  // same, so that no rank can take another branch than the others (docs/failures.md).
  double verdict[2] = {finite ? 0.0 : 1.0, spike.empty() ? 0.0 : 1.0};
  {
    Profiler::Scope reduce(profiler, phase::kScalarAllReduce, Profiler::Kind::communication);
    world.all_reduce_host(verdict, 2, ReduceOp::max);
  }
  result.nonfinite = verdict[0] > 0.0;
  result.spike = !result.nonfinite && verdict[1] > 0.0;
  if (result.spike)
    result.spike_reason = spike.empty() ? "another rank judged this step a spike" : spike;
  // This step's loss measured the weights of step `step`: a normal one vouches for them.
  guard.step_done(step, result.updated(), loss);
  if (result.nonfinite) {
    result.nonfinite_tensor =
        first_nonfinite_gradient(state, optimizer.segments(), model.table(), backend, world);
    return result;
  }
  if (result.spike) return result;
  if (Watchdog* watchdog = world.watchdog().get()) watchdog->set_phase("optimizer");
  {
    Profiler::Scope update(profiler, phase::kOptimizer);
    optimizer.update(state.master(), state.gradient_shard(), float(lr),
                     clip_scale(result.grad_norm, train.grad_clip), step + 1);
  }
  state.publish_weights();
  return result;
}

}  // namespace ulysses
