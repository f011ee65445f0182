#include "core/model.h"

#include <cmath>
#include <random>
#include <stdexcept>

namespace ulysses {

namespace {

using R = ParamRole;

// Normal samples from a seeded 64-bit Mersenne twister with Box-Muller, so weights are
// the same on every platform and rank.
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : engine_(seed) {}
  float next(float stddev) {
    if (has_spare_) {
      has_spare_ = false;
      return float(spare_ * stddev);
    }
    double u1 = (double(engine_() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = double(engine_() >> 11) * 0x1.0p-53;
    double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return float(radius * std::cos(2.0 * M_PI * u2) * stddev);
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace

namespace {

int64_t padded_numel(int64_t total, int blocks) {
  return (total + blocks - 1) / blocks * blocks;
}

}  // namespace

Model::Model(const Config& config, Backend& backend, Comm& sp_comm, int64_t batch,
             int64_t seq_local, int flat_blocks)
    : model_(config.model),
      memory_(config.memory),
      backend_(backend),
      table_(config.model),
      shape_{batch, seq_local, int64_t(sp_comm.rank()) * seq_local},
      params_(backend.alloc(MemCategory::params, DType::f32,
                            {padded_numel(table_.total_numel(), flat_blocks)}, "parameters")),
      grads_(backend.alloc(MemCategory::grads, DType::f32,
                           {padded_numel(table_.total_numel(), flat_blocks)}, "gradients")),
      attention_(backend, sp_comm, config.model.n_heads, config.model.n_kv_heads,
                 config.model.head_dim()),
      block_(config.model, backend, attention_),
      recompute_(config.memory.activation_checkpointing == "layer") {
  const int64_t rows = batch * seq_local, C = model_.d_model;
  if (backend.compute_dtype() != DType::f32)
    compute_params_ = backend.alloc(MemCategory::params, backend.compute_dtype(),
                                    {table_.total_numel()}, "parameters (compute copy)");
  tokens_ = backend.alloc(MemCategory::activations, DType::i32, {batch, seq_local}, "tokens");
  targets_ = backend.alloc(MemCategory::activations, DType::i32, {rows}, "targets");
  const MemCategory residual_category =
      recompute_ ? MemCategory::checkpoints : MemCategory::activations;
  for (int i = 0; i <= model_.n_layers; ++i)
    residuals_.push_back(
        backend.alloc(residual_category, backend.compute_dtype(), {rows, C}, "block input"));
  for (int i = 0; i < (recompute_ ? 1 : model_.n_layers); ++i)
    acts_.push_back(block_.allocate_activations(shape_));
  final_norm_out_ =
      backend.alloc(MemCategory::activations, backend.compute_dtype(), {rows, C}, "final norm");
  final_rstd_ = backend.alloc(MemCategory::activations, DType::f32, {rows}, "final norm rstd");
  if (model_.family == "gpt2")
    final_mean_ = backend.alloc(MemCategory::activations, DType::f32, {rows}, "final norm mean");
  scratch_ = block_.allocate_scratch(shape_);
  dresidual_ =
      backend.alloc(MemCategory::workspace, backend.compute_dtype(), {rows, C}, "d residual");
  dhidden_ = backend.alloc(MemCategory::workspace, backend.compute_dtype(), {rows, C}, "d hidden");
}

void Model::init_weights(uint64_t seed) {
  NormalSampler sampler(seed);
  const float stddev = 0.02f;
  const float residual_stddev = stddev / std::sqrt(2.0f * float(model_.n_layers));
  std::vector<float> host(size_t(table_.total_numel()));
  for (const ParamSpec& spec : table_.specs()) {
    float* values = host.data() + spec.offset;
    for (int64_t i = 0; i < spec.numel; ++i) {
      switch (spec.init) {
        case ParamSpec::Init::normal:
          values[i] = sampler.next(stddev);
          break;
        case ParamSpec::Init::residual_normal:
          values[i] = sampler.next(residual_stddev);
          break;
        case ParamSpec::Init::ones:
          values[i] = 1.0f;
          break;
        case ParamSpec::Init::zeros:
          values[i] = 0.0f;
          break;
      }
    }
  }
  backend_.fill_zero(params_);  // the padding, too
  backend_.upload(params(), host.data());
  refresh_compute_params();
}

void Model::refresh_compute_params() {
  if (!compute_params_.empty()) backend_.cast(compute_params_, params());
}

const Tensor& Model::weights() const {
  return compute_params_.empty() ? params_.tensor() : compute_params_.tensor();
}

void Model::zero_grads() {
  backend_.fill_zero(grads_);
}

BlockActivations& Model::activations(int layer) {
  return acts_[recompute_ ? 0 : layer];
}

Tensor Model::lm_head_weight(const Tensor& flat) const {
  return table_.has(R::lm_head) ? table_.view(flat, R::lm_head)
                                : table_.view(flat, R::token_embedding);
}

void Model::forward(const MicroBatch& batch) {
  if (batch.batch != shape_.batch || batch.seq_local != shape_.seq_local ||
      batch.pos_offset != shape_.pos_offset)
    throw std::logic_error("micro-batch shape differs from the one the model was built for");
  backend_.upload(tokens_, batch.inputs.data());
  backend_.upload(targets_, batch.targets.data());
  const Tensor& p = weights();
  Tensor wpe = table_.has(R::position_embedding) ? table_.view(p, R::position_embedding) : Tensor();
  backend_.embedding_forward(
      residuals_[0].tensor().reshape({shape_.batch, shape_.seq_local, model_.d_model}), tokens_,
      table_.view(p, R::token_embedding), wpe, shape_.pos_offset);
  for (int layer = 0; layer < model_.n_layers; ++layer)
    block_.forward(layer_tensors(table_, p, layer), shape_, residuals_[layer],
                   residuals_[layer + 1], activations(layer), scratch_);
  final_norm_forward();
}

void Model::final_norm_forward() {
  const Tensor& p = weights();
  const Tensor& x = residuals_.back().tensor();
  const float eps = float(model_.norm_eps);
  if (model_.family == "llama") {
    backend_.rmsnorm_forward(final_norm_out_, final_rstd_, x, table_.view(p, R::final_norm_weight),
                             eps);
  } else {
    backend_.layernorm_forward(final_norm_out_, final_mean_, final_rstd_, x,
                               table_.view(p, R::final_norm_weight),
                               table_.view(p, R::final_norm_bias), eps);
  }
}

void Model::final_norm_backward(const Tensor& dhidden) {
  const Tensor& p = weights();
  const Tensor& g = grads_.tensor();
  const Tensor& x = residuals_.back().tensor();
  backend_.fill_zero(dresidual_);
  if (model_.family == "llama") {
    backend_.rmsnorm_backward(dresidual_, table_.view(g, R::final_norm_weight), dhidden, x,
                              table_.view(p, R::final_norm_weight), final_rstd_);
  } else {
    backend_.layernorm_backward(dresidual_, table_.view(g, R::final_norm_weight),
                                table_.view(g, R::final_norm_bias), dhidden, x,
                                table_.view(p, R::final_norm_weight), final_mean_, final_rstd_);
  }
}

LossResult Model::forward_backward(const MicroBatch& batch, float grad_scale) {
  forward(batch);
  const Tensor& p = weights();
  const Tensor& g = grads_.tensor();
  LossResult loss =
      backend_.lm_head_loss(final_norm_out_, lm_head_weight(p), targets_, memory_.loss_tile_tokens,
                            grad_scale, dhidden_, lm_head_weight(g));
  final_norm_backward(dhidden_);
  for (int layer = model_.n_layers - 1; layer >= 0; --layer) {
    const LayerTensors weights = layer_tensors(table_, p, layer);
    // The shared set still holds the last block's activations from the forward pass.
    // Recomputing writes the same bits into residuals_[layer + 1], no longer needed.
    if (recompute_ && layer != model_.n_layers - 1)
      block_.forward(weights, shape_, residuals_[layer], residuals_[layer + 1], acts_[0], scratch_);
    block_.backward(weights, layer_tensors(table_, g, layer), shape_, residuals_[layer],
                    activations(layer), scratch_, dresidual_);
  }
  Tensor dwpe =
      table_.has(R::position_embedding) ? table_.view(g, R::position_embedding) : Tensor();
  backend_.embedding_backward(
      table_.view(g, R::token_embedding), dwpe,
      dresidual_.tensor().reshape({shape_.batch, shape_.seq_local, model_.d_model}), tokens_,
      shape_.pos_offset);
  return loss;
}

LossResult Model::evaluate(const MicroBatch& batch) {
  forward(batch);
  return backend_.lm_head_loss(final_norm_out_, lm_head_weight(weights()), targets_,
                               memory_.loss_tile_tokens, 1.0f, Tensor(), Tensor());
}

}  // namespace ulysses
