#include "parallel/zero_state.h"

#include <stdexcept>

namespace ulysses {

ZeroState::ZeroState(Backend& backend, Comm& world, int stage,
                     const std::vector<int64_t>& unit_ends)
    : backend_(backend),
      world_(world),
      stage_(world.size() > 1 ? stage : 0),
      layout_(unit_ends, stage_ >= 1 ? world.rank() : 0, stage_ >= 1 ? world.size() : 1),
      compute_dtype_(backend.compute_dtype()),
      reduced_(layout_.units().size(), false) {
  if (stage < 0 || stage > 3)
    throw std::invalid_argument("ZeRO stage " + std::to_string(stage) + " (0 to 3 exist)");
  const bool low_precision = compute_dtype_ != DType::f32;
  const int64_t padded = layout_.padded_numel(), shard = layout_.shard_numel();
  const int64_t unit = layout_.max_padded_unit();
  if (stage_ == 0) {
    whole_weights_ = backend.alloc(MemCategory::params, DType::f32, {padded}, "parameters");
    if (low_precision)
      compute_copy_ =
          backend.alloc(MemCategory::params, compute_dtype_, {padded}, "parameters (compute copy)");
  } else if (stage_ <= 2) {
    whole_weights_ = backend.alloc(MemCategory::params, compute_dtype_, {padded}, "parameters");
  }
  // The master shard is optimizer state unless it is itself what stage 3 gathers.
  if (sharded())
    master_ =
        backend.alloc(stage_ == 3 && !low_precision ? MemCategory::params : MemCategory::optimizer,
                      DType::f32, {shard}, "master weights shard");
  if (stage_ == 3 && low_precision)
    compute_copy_ = backend.alloc(MemCategory::params, compute_dtype_, {shard},
                                  "parameter shard (compute copy)");
  if (stage_ <= 1)
    whole_grads_ = backend.alloc(MemCategory::grads, DType::f32, {padded}, "gradients");
  if (sharded())
    grad_shard_ = backend.alloc(MemCategory::grads, DType::f32, {shard}, "gradient shard");
  if (stage_ >= 2)
    staging_ = backend.alloc(MemCategory::grads, DType::f32, {unit}, "gradient of one unit");
  if (stage_ == 3)
    gathered_ =
        backend.alloc(MemCategory::params, compute_dtype_, {unit}, "gathered weights of one unit");
  if (backend.memory().planning()) return;  // --dry-run: charged, never touched
  // Padding must stay zero: it is reduced, gathered and summed in the gradient norm.
  for (Buffer* buffer : {&whole_weights_, &compute_copy_, &master_, &whole_grads_, &grad_shard_})
    if (!buffer->empty()) backend.fill_zero(*buffer);
}

Tensor ZeroState::padded_unit(const Tensor& padded, int unit) const {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  return padded.flat_range(u.padded_begin, u.block * layout_.world());
}

Tensor ZeroState::shard_block(const Tensor& shard, int unit) const {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  return shard.flat_range(u.shard_begin, u.block);
}

Tensor ZeroState::weights(int unit) {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  if (stage_ < 3) {
    const Tensor& whole = compute_copy_.empty() ? whole_weights_.tensor() : compute_copy_.tensor();
    return whole.flat_range(u.padded_begin, u.numel());
  }
  const Tensor gathered = gathered_.tensor().flat_range(0, u.block * layout_.world());
  if (gathered_unit_ != unit) {
    const Tensor& source = compute_copy_.empty() ? master_.tensor() : compute_copy_.tensor();
    Profiler::Scope wait(backend_.profiler(), phase::kWeightGatherWait,
                         Profiler::Kind::communication, int64_t(gathered.bytes()));
    world_.all_gather(shard_block(source, unit), gathered);
    gathered_unit_ = unit;
  }
  return gathered.flat_range(0, u.numel());
}

Tensor ZeroState::gradients(int unit) {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  if (stage_ <= 1) return whole_grads_.tensor().flat_range(u.padded_begin, u.numel());
  if (staging_unit_ != unit) {
    flush_staging();
    backend_.fill_zero(staging_.tensor().flat_range(0, u.block * layout_.world()));
    staging_unit_ = unit;
  }
  return staging_.tensor().flat_range(0, u.numel());
}

void ZeroState::flush_staging() {
  if (staging_unit_ < 0) return;
  const ShardUnit& u = layout_.units()[size_t(staging_unit_)];
  reduce_unit(staging_unit_, staging_.tensor().flat_range(0, u.block * layout_.world()));
  staging_unit_ = -1;
}

void ZeroState::finish_backward() {
  if (stage_ >= 2) flush_staging();
}

void ZeroState::reduce_unit(int unit, const Tensor& padded_source) {
  Profiler::Scope wait(backend_.profiler(), phase::kGradientReductionWait,
                       Profiler::Kind::communication, int64_t(padded_source.bytes()));
  const Tensor target = shard_block(grad_shard_, unit);
  if (!reduced_[size_t(unit)]) {
    world_.reduce_scatter(padded_source, target, ReduceOp::sum);
    reduced_[size_t(unit)] = true;
    return;
  }
  Buffer part = backend_.alloc(MemCategory::comm, DType::f32, {target.numel()},
                               "gradient block (reduce-scatter)");
  world_.reduce_scatter(padded_source, part, ReduceOp::sum);
  backend_.axpy(target, part, 1.0f);
}

void ZeroState::zero_gradients() {
  if (!whole_grads_.empty()) backend_.fill_zero(whole_grads_);
  if (!grad_shard_.empty()) backend_.fill_zero(grad_shard_);
  staging_unit_ = -1;
  reduced_.assign(reduced_.size(), false);
}

void ZeroState::reduce_gradients() {
  if (staging_unit_ >= 0)
    throw std::logic_error("ZeroState: reduce_gradients before finish_backward");
  if (stage_ == 0) {
    Profiler::Scope wait(backend_.profiler(), phase::kGradientReductionWait,
                         Profiler::Kind::communication, int64_t(whole_grads_.tensor().bytes()));
    if (world_.size() > 1) world_.all_reduce(whole_grads_, ReduceOp::sum);
  } else if (stage_ == 1) {
    for (size_t unit = 0; unit < layout_.units().size(); ++unit)
      reduce_unit(int(unit), padded_unit(whole_grads_, int(unit)));
  }
}

double ZeroState::gradient_norm_squared() {
  if (!sharded()) return backend_.sum_squares(whole_grads_);
  double norm_squared = backend_.sum_squares(grad_shard_);
  world_.all_reduce_host(&norm_squared, 1, ReduceOp::sum);
  return norm_squared;
}

const Tensor& ZeroState::master() const {
  return sharded() ? master_.tensor() : whole_weights_.tensor();
}

const Tensor& ZeroState::gradient_shard() const {
  return sharded() ? grad_shard_.tensor() : whole_grads_.tensor();
}

void ZeroState::publish_weights() {
  if (stage_ == 0) {
    if (!compute_copy_.empty()) backend_.cast(compute_copy_, whole_weights_);
  } else if (stage_ <= 2) {
    Profiler::Scope wait(backend_.profiler(), phase::kWeightGatherWait,
                         Profiler::Kind::communication, int64_t(whole_weights_.tensor().bytes()));
    for (size_t unit = 0; unit < layout_.units().size(); ++unit) {
      const Tensor master_block = shard_block(master_, int(unit));
      const Tensor target = padded_unit(whole_weights_, int(unit));
      if (compute_dtype_ == DType::f32) {
        world_.all_gather(master_block, target);
      } else {
        Buffer block = backend_.alloc(MemCategory::comm, compute_dtype_, {master_block.numel()},
                                      "weights block (all-gather)");
        backend_.cast(block, master_block);
        world_.all_gather(block, target);
      }
    }
  } else {
    if (!compute_copy_.empty()) backend_.cast(compute_copy_, master_);
    gathered_unit_ = -1;
  }
}

void ZeroState::upload_weights(const float* host) {
  if (!sharded()) {
    backend_.upload(whole_weights_, host);
  } else {
    for (const ShardSegment& segment : layout_.segments())
      backend_.upload(master_.tensor().flat_range(segment.shard_begin, segment.size()),
                      host + segment.begin);
  }
  publish_weights();
}

void ZeroState::download_sharded(const Tensor& shard, float* host) {
  for (size_t unit = 0; unit < layout_.units().size(); ++unit) {
    const ShardUnit& u = layout_.units()[unit];
    Buffer gathered = backend_.alloc(MemCategory::comm, DType::f32, {u.block * layout_.world()},
                                     "gathered unit (download)");
    world_.all_gather(shard_block(shard, int(unit)), gathered);
    if (host) backend_.download(host + u.begin, gathered.tensor().flat_range(0, u.numel()));
  }
}

void ZeroState::download_weights(float* host) {
  if (!sharded()) {
    if (host) backend_.download(host, whole_weights_);
    return;
  }
  download_sharded(master_, host);
}

void ZeroState::download_gradients(float* host) {
  if (!sharded()) {
    if (host) backend_.download(host, whole_grads_);
    return;
  }
  download_sharded(grad_shard_, host);
}

}  // namespace ulysses
