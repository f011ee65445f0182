#include "parallel/zero_state.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>

#include "kernels/staged_upload.h"

namespace ulysses {

namespace {

// The most floats of one half of the staging block for uploads: 32 MiB keep the copy engine
// busy while the host makes the next piece.
constexpr int64_t kStagingPiece = int64_t(8) << 20;

}  // namespace

ZeroState::ZeroState(Backend& backend, Comm& world, int stage,
                     const std::vector<int64_t>& unit_ends, int slots)
    : backend_(backend),
      world_(world),
      stage_(world.size() > 1 ? stage : 0),
      slots_(slots),
      layout_(unit_ends, stage_ >= 1 ? world.rank() : 0, stage_ >= 1 ? world.size() : 1),
      compute_dtype_(backend.compute_dtype()),
      reduced_(layout_.units().size(), false) {
  if (stage < 0 || stage > 3)
    throw std::invalid_argument("ZeRO stage " + std::to_string(stage) + " (0 to 3 exist)");
  if (slots < 1 || slots > 2)
    throw std::invalid_argument("ZeroState: 1 or 2 slots, got " + std::to_string(slots));
  const bool low_precision = compute_dtype_ != DType::f32;
  const int64_t padded = layout_.padded_numel(), shard = layout_.shard_numel();
  const int64_t unit = layout_.max_padded_unit();
  // Zero from the start, padding included: it is reduced, gathered and summed in the gradient
  // norm, and must stay zero.
  if (stage_ == 0) {
    whole_weights_ = backend.alloc_zeroed(MemCategory::params, DType::f32, {padded}, "parameters");
    if (low_precision)
      compute_copy_ = backend.alloc_zeroed(MemCategory::params, compute_dtype_, {padded},
                                           "parameters (compute copy)");
  } else if (stage_ <= 2) {
    whole_weights_ =
        backend.alloc_zeroed(MemCategory::params, compute_dtype_, {padded}, "parameters");
  }
  // The master shard is optimizer state unless it is itself what stage 3 gathers.
  if (sharded())
    master_ = backend.alloc_zeroed(
        stage_ == 3 && !low_precision ? MemCategory::params : MemCategory::optimizer, DType::f32,
        {shard}, "master weights shard");
  if (stage_ == 3 && low_precision)
    compute_copy_ = backend.alloc_zeroed(MemCategory::params, compute_dtype_, {shard},
                                         "parameter shard (compute copy)");
  if (stage_ <= 1)
    whole_grads_ = backend.alloc_zeroed(MemCategory::grads, DType::f32, {padded}, "gradients");
  if (sharded())
    grad_shard_ = backend.alloc_zeroed(MemCategory::grads, DType::f32, {shard}, "gradient shard");
  for (int slot = 0; stage_ >= 2 && slot < slots_; ++slot) {
    staging_.push_back(
        backend.alloc(MemCategory::grads, DType::f32, {unit}, "gradient of one unit"));
    staging_unit_.push_back(-1);
  }
  for (int slot = 0; stage_ == 3 && slot < slots_; ++slot) {
    gathered_.push_back(
        backend.alloc(MemCategory::params, compute_dtype_, {unit}, "gathered weights of one unit"));
    gathered_unit_.push_back(-1);
    gathered_in_use_.push_back(false);
  }
}

// A started gather or reduction: its wait is timed as the schedule's wait, the whole flight
// is recorded, and what completes the operation (adding a reduced part into the shard,
// freeing the staging slot) runs once it has arrived. A handle dropped without wait() waits.
class ZeroState::Pending final : public CommRequest {
 public:
  Pending(ZeroState& state, CommHandle inner, const char* wait_phase, const char* flight_phase,
          int64_t bytes, std::function<void()> after)
      : state_(state),
        inner_(std::move(inner)),
        wait_phase_(wait_phase),
        flight_phase_(flight_phase),
        bytes_(bytes),
        issued_at_(state.backend_.profiler().now()),
        after_(std::move(after)) {}
  ~Pending() override { wait_unless_done(); }

 private:
  void complete() override {
    Profiler& profiler = state_.backend_.profiler();
    {
      Profiler::Scope wait(profiler, wait_phase_, Profiler::Kind::communication, bytes_);
      inner_->wait();
    }
    profiler.record_in_flight(flight_phase_, issued_at_, profiler.now(), bytes_);
    if (after_) after_();
  }

  ZeroState& state_;
  CommHandle inner_;
  const char* wait_phase_;
  const char* flight_phase_;
  int64_t bytes_;
  double issued_at_;
  std::function<void()> after_;
};

int ZeroState::slot_of(const std::vector<int>& tags, int unit) {
  for (size_t slot = 0; slot < tags.size(); ++slot)
    if (tags[slot] == unit) return int(slot);
  return -1;
}

Tensor ZeroState::padded_unit(const Tensor& padded, int unit) const {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  return padded.flat_range(u.padded_begin, u.block * layout_.world());
}

Tensor ZeroState::shard_block(const Tensor& shard, int unit) const {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  return shard.flat_range(u.shard_begin, u.block);
}

CommHandle ZeroState::start_gather(int unit) {
  if (stage_ < 3) return nullptr;
  int slot = slot_of(gathered_unit_, unit);
  if (slot >= 0 && !gathered_in_use_[size_t(slot)]) {  // still there from an earlier use
    gathered_in_use_[size_t(slot)] = true;
    return nullptr;
  }
  if (slot >= 0) throw std::logic_error("ZeroState: unit gathered twice without a release");
  for (size_t free = 0; free < gathered_.size() && slot < 0; ++free)
    if (!gathered_in_use_[free]) slot = int(free);
  if (slot < 0)
    throw std::logic_error("ZeroState: every gather slot holds a unit in use; release one first");
  const ShardUnit& u = layout_.units()[size_t(unit)];
  const Tensor target = gathered_[size_t(slot)].tensor().flat_range(0, u.block * layout_.world());
  const Tensor& source = compute_copy_.empty() ? master_.tensor() : compute_copy_.tensor();
  gathered_unit_[size_t(slot)] = unit;
  gathered_in_use_[size_t(slot)] = true;
  return std::make_unique<Pending>(
      *this, world_.all_gather_async(shard_block(source, unit), target), phase::kWeightGatherWait,
      phase::kWeightGatherInFlight, int64_t(target.bytes()), nullptr);
}

Tensor ZeroState::weights(int unit) const {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  if (stage_ < 3) {
    const Tensor& whole = compute_copy_.empty() ? whole_weights_.tensor() : compute_copy_.tensor();
    return whole.flat_range(u.padded_begin, u.numel());
  }
  const int slot = slot_of(gathered_unit_, unit);
  if (slot < 0 || !gathered_in_use_[size_t(slot)])
    throw std::logic_error("ZeroState: weights of unit " + std::to_string(unit) +
                           " asked for without start_gather");
  return gathered_[size_t(slot)].tensor().flat_range(0, u.numel());
}

void ZeroState::release(int unit) {
  if (stage_ < 3) return;
  const int slot = slot_of(gathered_unit_, unit);
  if (slot >= 0) gathered_in_use_[size_t(slot)] = false;
}

void ZeroState::begin_gradients(int unit) {
  if (stage_ <= 1) return;
  const int slot = slot_of(staging_unit_, -1);
  if (slot < 0)
    throw std::logic_error(
        "ZeroState: every staging slot holds a unit; wait for a reduction before beginning "
        "another unit's gradients");
  const ShardUnit& u = layout_.units()[size_t(unit)];
  backend_.fill_zero(staging_[size_t(slot)].tensor().flat_range(0, u.block * layout_.world()));
  staging_unit_[size_t(slot)] = unit;
}

Tensor ZeroState::gradients(int unit) const {
  const ShardUnit& u = layout_.units()[size_t(unit)];
  if (stage_ <= 1) return whole_grads_.tensor().flat_range(u.padded_begin, u.numel());
  const int slot = slot_of(staging_unit_, unit);
  if (slot < 0)
    throw std::logic_error("ZeroState: gradients of unit " + std::to_string(unit) +
                           " asked for without begin_gradients");
  return staging_[size_t(slot)].tensor().flat_range(0, u.numel());
}

CommHandle ZeroState::start_reduction(int unit) {
  if (stage_ <= 1) return nullptr;
  const int slot = slot_of(staging_unit_, unit);
  if (slot < 0) throw std::logic_error("ZeroState: reduction of a unit that is not staged");
  const ShardUnit& u = layout_.units()[size_t(unit)];
  const Tensor source = staging_[size_t(slot)].tensor().flat_range(0, u.block * layout_.world());
  const Tensor target = shard_block(grad_shard_, unit);
  auto free_slot = [this, slot] { staging_unit_[size_t(slot)] = -1; };
  // A later micro-batch's part is reduced apart and added: the shard sums the parts in the
  // order they were started.
  if (!reduced_[size_t(unit)]) {
    reduced_[size_t(unit)] = true;
    return std::make_unique<Pending>(
        *this, world_.reduce_scatter_async(source, target, ReduceOp::sum),
        phase::kGradientReductionWait, phase::kGradientReductionInFlight, int64_t(source.bytes()),
        free_slot);
  }
  auto part = std::make_shared<Buffer>(backend_.alloc(
      MemCategory::comm, DType::f32, {target.numel()}, "gradient block (reduce-scatter)"));
  return std::make_unique<Pending>(*this, world_.reduce_scatter_async(source, *part, ReduceOp::sum),
                                   phase::kGradientReductionWait, phase::kGradientReductionInFlight,
                                   int64_t(source.bytes()), [this, part, target, free_slot] {
                                     backend_.axpy(target, *part, 1.0f);
                                     part->reset();
                                     free_slot();
                                   });
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
  staging_unit_.assign(staging_unit_.size(), -1);
  reduced_.assign(reduced_.size(), false);
}

void ZeroState::reduce_gradients() {
  if (slot_of(staging_unit_, -1) < 0 && !staging_unit_.empty())
    throw std::logic_error("ZeroState: reduce_gradients with every staging slot in use");
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
    gathered_unit_.assign(gathered_unit_.size(), -1);  // the gathered weights are stale
    gathered_in_use_.assign(gathered_in_use_.size(), false);
  }
}

const Tensor& ZeroState::master_weights() const {
  return sharded() ? master_.tensor() : whole_weights_.tensor();
}

void ZeroState::for_each_stored_piece(
    const std::function<void(int64_t begin, int64_t shard_begin, int64_t count)>& visit) const {
  const int64_t piece = host_piece();
  for (const ShardSegment& segment : layout_.segments())
    for (int64_t done = 0; done < segment.size(); done += piece)
      visit(segment.begin + done, segment.shard_begin + done,
            std::min(piece, segment.size() - done));
}

void ZeroState::upload_weights(const FlatRangeReader& read) {
  if (!backend_.host_memory_is_separate()) {
    // The master weights are host memory: the reader fills them in place.
    for_each_stored_piece([&](int64_t begin, int64_t shard_begin, int64_t count) {
      read(begin, count, static_cast<float*>(master_weights().flat_range(shard_begin, count).data));
    });
  } else {
    // Two halves of at most one unit together: the reader fills one while the other travels.
    // Each stored piece is cut further, so every range read lies inside one of them (as
    // StoredWeights needs).
    StagedUpload staged(backend_, std::max<int64_t>(1, std::min(kStagingPiece, host_piece() / 2)));
    for_each_stored_piece([&](int64_t begin, int64_t shard_begin, int64_t count) {
      for (int64_t done = 0; done < count; done += staged.piece()) {
        const int64_t n = std::min(staged.piece(), count - done);
        read(begin + done, n, staged.next());
        staged.send(master_weights().flat_range(shard_begin + done, n));
      }
    });
    staged.finish();
  }
  publish_weights();
}

void ZeroState::download_stored_weights(const FlatRangeWriter& write) {
  std::vector<float> host;
  for_each_stored_piece([&](int64_t begin, int64_t shard_begin, int64_t count) {
    host.resize(size_t(count));
    backend_.download(host.data(), master_weights().flat_range(shard_begin, count));
    write(begin, count, host.data());
  });
}

void ZeroState::upload_weights(const float* host) {
  upload_weights(
      [host](int64_t begin, int64_t count, float* out) { std::copy_n(host + begin, count, out); });
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

void StoredWeights::add(int64_t begin, int64_t count, const float* values) {
  pieces_.push_back({begin, count, values_.size()});
  values_.insert(values_.end(), values, values + count);
}

void StoredWeights::read(int64_t begin, int64_t count, float* out) const {
  auto after = std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                                [](int64_t element, const Piece& p) { return element < p.begin; });
  if (after == pieces_.begin() || begin + count > std::prev(after)->begin + std::prev(after)->count)
    throw std::logic_error("weights [" + std::to_string(begin) + ", " +
                           std::to_string(begin + count) + ") were not stored by this rank");
  const Piece& piece = *std::prev(after);
  std::copy_n(values_.begin() + ptrdiff_t(piece.at + size_t(begin - piece.begin)), count, out);
}

}  // namespace ulysses
