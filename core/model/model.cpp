#include "core/model/model.h"

#include <algorithm>
#include <stdexcept>

#include "core/model/param_init.h"

namespace ulysses {

namespace {

using R = ParamRole;

int64_t bucket_elements(double bucket_mb) {
  return std::max<int64_t>(1, int64_t(bucket_mb * 1024.0 * 1024.0 / 4.0));
}

}  // namespace

Model::Model(const Config& config, Backend& backend, Comm& sp_comm, Comm& world, int64_t batch,
             int64_t seq_local, RingComms ring)
    : model_config_(config.model),
      memory_(config.memory),
      backend_(backend),
      loss_tile_tokens_(
          config.memory.loss_tile_tokens > 0
              ? config.memory.loss_tile_tokens
              : backend.auto_loss_tile_tokens(config.model.vocab_size, config.model.d_model)),
      table_(config.model),
      shape_{batch, seq_local, int64_t(sp_comm.rank()) * seq_local},
      state_(backend, world, config.parallel.zero_stage,
             shard_unit_ends(table_, bucket_elements(config.parallel.bucket_mb)),
             config.parallel.prefetch ? 2 : 1),
      prefetch_(config.parallel.prefetch),
      attention_(backend, ring.ulysses ? *ring.ulysses : sp_comm, config.model.n_heads,
                 config.model.n_kv_heads, config.model.head_dim(), config.parallel.head_chunks,
                 ring.ring),
      block_(config.model, config.memory, config.parallel.overlap, backend, attention_),
      recompute_(config.memory.activation_checkpointing == ActivationCheckpointing::layer),
      offload_moves_(recompute_ && config.memory.offload_checkpoints &&
                     backend.host_memory_is_separate()) {
  const int64_t rows = batch * seq_local, C = model_config_.d_model;
  tokens_ = backend.alloc(MemCategory::activations, DType::i32, {batch, seq_local}, "tokens");
  targets_ = backend.alloc(MemCategory::activations, DType::i32, {rows}, "targets");
  // memory.offload_checkpoints: the layer inputs live in host memory. On the cpu backend that
  // is where they are anyway: only their category says so (docs/memory.md).
  const MemCategory residual_category = !recompute_ ? MemCategory::activations
                                        : config.memory.offload_checkpoints && !offload_moves_
                                            ? MemCategory::checkpoints_host
                                            : MemCategory::checkpoints;
  for (int i = 0; i < (offload_moves_ ? 2 : model_config_.n_layers + 1); ++i)
    residuals_.push_back(
        backend.alloc(residual_category, backend.compute_dtype(), {rows, C}, "block input"));
  if (offload_moves_) {
    for (int i = 0; i < model_config_.n_layers; ++i)
      host_inputs_.push_back(backend.alloc(MemCategory::checkpoints_host, backend.compute_dtype(),
                                           {rows, C}, "offloaded block input"));
    if (!block_.mlp_recomputed_by_backward(rows))
      recompute_out_ = backend.alloc(MemCategory::workspace, backend.compute_dtype(), {rows, C},
                                     "recomputed block output");
    offloaded_.assign(size_t(model_config_.n_layers), 0);
  }
  for (int i = 0; i < (recompute_ ? 1 : model_config_.n_layers); ++i)
    acts_.push_back(block_.allocate_activations(shape_));
  final_rstd_ = backend.alloc(MemCategory::activations, DType::f32, {rows}, "final norm rstd");
  if (architecture(model_config_.family).norm == NormKind::layer)
    final_mean_ = backend.alloc(MemCategory::activations, DType::f32, {rows}, "final norm mean");
}

void Model::init_weights(uint64_t seed) {
  load_weights([&](int64_t begin, int64_t count, float* out) {
    initial_weights(table_, model_config_.n_layers, seed, begin, count, out);
  });
}

void Model::load_weights(const FlatRangeReader& read) {
  state_.upload_weights(read);
}

void Model::load_weights(const float* host) {
  state_.upload_weights(host);
}

void Model::download_weights(float* host) {
  state_.download_weights(host);
}

void Model::download_gradients(float* host) {
  state_.download_gradients(host);
}

void Model::zero_grads() {
  state_.zero_gradients();
}

int Model::unit_of(ParamRole role) const {
  return state_.layout().unit_of(table_.find(role).offset);
}

int Model::layer_unit(int layer) const {
  return state_.layout().unit_of(table_.layer_range(layer).first);
}

Tensor Model::outside_blocks(ParamRole role, bool gradients) const {
  if (!table_.has(role)) return Tensor();
  const int unit = unit_of(role);
  const Tensor window = gradients ? state_.gradients(unit) : state_.weights(unit);
  return table_.view(window, state_.layout().units()[size_t(unit)].begin, table_.find(role));
}

LayerTensors Model::layer_view(int index, bool gradients) const {
  const int unit = layer_unit(index);
  const Tensor window = gradients ? state_.gradients(unit) : state_.weights(unit);
  return layer_tensors(table_, window, state_.layout().units()[size_t(unit)].begin, index);
}

ParamRole Model::lm_head_role() const {
  return table_.has(R::lm_head) ? R::lm_head : R::token_embedding;
}

BlockActivations& Model::activations(int layer) {
  return acts_[recompute_ ? 0 : layer];
}

std::vector<int> Model::unit_plan(bool backward) const {
  std::vector<int> plan = {unit_of(R::token_embedding)};
  for (int layer = 0; layer < model_config_.n_layers; ++layer) plan.push_back(layer_unit(layer));
  plan.push_back(unit_of(R::final_norm_weight));
  plan.push_back(unit_of(lm_head_role()));
  if (!backward) return plan;
  plan.push_back(unit_of(R::final_norm_weight));
  for (int layer = model_config_.n_layers - 1; layer >= 0; --layer)
    plan.push_back(layer_unit(layer));
  plan.push_back(unit_of(R::token_embedding));
  return plan;
}

Buffer& Model::block_input(int layer) {
  return residuals_[size_t(offload_moves_ ? layer % 2 : layer)];
}

void Model::forward(const MicroBatch& batch, WeightPipeline& weights) {
  if (batch.batch != shape_.batch || batch.seq_local != shape_.seq_local ||
      batch.pos_offset != shape_.pos_offset)
    throw std::logic_error("micro-batch shape differs from the one the model was built for");
  shape_.documents = batch.documents;
  counted_rows_ = shape_.batch * shape_.seq_local;
  if (!backend_.memory().planning()) {  // a planned step has shapes, no tokens
    backend_.upload(tokens_, batch.inputs.data());
    backend_.upload(targets_, batch.targets.data());
    counted_rows_ = std::count_if(batch.targets.begin(), batch.targets.end(),
                                  [](int32_t target) { return target >= 0; });
  }
  // The last pass's copies may still read the device inputs this one overwrites.
  if (offload_moves_) backend_.wait_transfer(last_transfer_);
  weights.take(unit_of(R::token_embedding));
  {
    Profiler::Scope embedding(backend_.profiler(), phase::kEmbedding);
    embed(block_input(0).tensor().reshape({shape_.batch, shape_.seq_local, model_config_.d_model}));
  }
  if (offload_moves_)
    offloaded_[0] = last_transfer_ = backend_.transfer(host_inputs_[0], block_input(0));
  for (int layer = 0; layer < model_config_.n_layers; ++layer) {
    weights.take(layer_unit(layer));
    // The output goes where the input of layer - 1 was: its copy out must be done.
    if (offload_moves_ && layer >= 1) backend_.wait_transfer(offloaded_[size_t(layer - 1)]);
    block_.forward(layer_view(layer, false), shape_, block_input(layer), block_input(layer + 1),
                   activations(layer));
    if (offload_moves_ && layer + 1 < model_config_.n_layers)
      offloaded_[size_t(layer + 1)] = last_transfer_ =
          backend_.transfer(host_inputs_[size_t(layer + 1)], block_input(layer + 1));
  }
  weights.take(unit_of(R::final_norm_weight));
  final_norm_forward();
}

void Model::embed(const Tensor& out) {
  const Tensor wpe = weight(R::position_embedding);
  if (shape_.documents.none() || wpe.empty()) {
    backend_.embedding_forward(out, tokens_, weight(R::token_embedding), wpe, shape_.pos_offset);
    return;
  }
  const int64_t C = model_config_.d_model;
  for_each_document_piece(shape_.documents, shape_.pos_offset, shape_.batch, shape_.seq_local,
                          [&](int64_t first, int64_t count, int64_t position) {
                            backend_.embedding_forward(
                                out.flat_range(first * C, count * C).reshape({1, count, C}),
                                tokens_.tensor().flat_range(first, count).reshape({1, count}),
                                weight(R::token_embedding), wpe, position);
                          });
}

void Model::embed_backward(const Tensor& dout) {
  const Tensor dwpe = gradient(R::position_embedding);
  if (shape_.documents.none() || dwpe.empty()) {
    backend_.embedding_backward(gradient(R::token_embedding), dwpe, dout, tokens_,
                                shape_.pos_offset);
    return;
  }
  const int64_t C = model_config_.d_model;
  for_each_document_piece(shape_.documents, shape_.pos_offset, shape_.batch, shape_.seq_local,
                          [&](int64_t first, int64_t count, int64_t position) {
                            backend_.embedding_backward(
                                gradient(R::token_embedding), dwpe,
                                dout.flat_range(first * C, count * C).reshape({1, count, C}),
                                tokens_.tensor().flat_range(first, count).reshape({1, count}),
                                position);
                          });
}

void Model::final_norm_forward() {
  const Tensor& x = block_input(model_config_.n_layers).tensor();
  final_norm_out_.reset();
  final_norm_out_ = backend_.alloc(MemCategory::activations, backend_.compute_dtype(),
                                   {x.dim(0), model_config_.d_model}, "final norm");
  const float eps = float(model_config_.norm_eps);
  if (architecture(model_config_.family).norm == NormKind::rms) {
    backend_.rmsnorm_forward(final_norm_out_, final_rstd_, x, weight(R::final_norm_weight), eps);
  } else {
    backend_.layernorm_forward(final_norm_out_, final_mean_, final_rstd_, x,
                               weight(R::final_norm_weight), weight(R::final_norm_bias), eps);
  }
}

void Model::final_norm_backward(const Tensor& dhidden, const Tensor& dresidual) {
  const Tensor& x = block_input(model_config_.n_layers).tensor();
  backend_.fill_zero(dresidual);
  if (architecture(model_config_.family).norm == NormKind::rms) {
    backend_.rmsnorm_backward(dresidual, gradient(R::final_norm_weight), dhidden, x,
                              weight(R::final_norm_weight), final_rstd_);
  } else {
    backend_.layernorm_backward(dresidual, gradient(R::final_norm_weight),
                                gradient(R::final_norm_bias), dhidden, x,
                                weight(R::final_norm_weight), final_mean_, final_rstd_);
  }
}

double Model::lm_head_flops(bool backward) const {
  const double forward = 2.0 * double(counted_rows_) * double(model_config_.d_model) *
                         double(model_config_.vocab_size);
  return backward ? 3.0 * forward : forward;
}

LossResult Model::forward_backward(const MicroBatch& batch, float grad_scale) {
  // Every unit's weights are taken in this order; with prefetch, taking one starts the
  // gather of the next (ZeRO-3), and a unit's gradient reduction (ZeRO-2/3) travels while
  // the units before it compute their backward.
  WeightPipeline weights(state_, unit_plan(true), prefetch_ ? 1 : 0);
  GradientPipeline grads(state_);
  forward(batch, weights);

  // The LM head's loss gives its weight gradient and d(final norm output) at once.
  weights.take(unit_of(lm_head_role()));
  grads.take(unit_of(lm_head_role()));
  // The [R, C] buffers outside the blocks live only as long as they are needed: the final
  // norm's output until the loss has read it, d(hidden) until the final norm's backward, and
  // d(residual) from there through every block to the embedding (docs/memory.md).
  const int64_t rows = shape_.batch * shape_.seq_local;
  LossResult loss;
  Buffer dhidden = backend_.alloc(MemCategory::workspace, backend_.compute_dtype(),
                                  {rows, model_config_.d_model}, "d hidden");
  {
    Profiler::Scope scope(backend_.profiler(), phase::kLoss, Profiler::Kind::compute, 0,
                          lm_head_flops(true));
    loss = backend_.lm_head_loss(final_norm_out_, weight(lm_head_role()), targets_,
                                 loss_tile_tokens_, grad_scale, dhidden, gradient(lm_head_role()));
  }
  final_norm_out_.reset();
  weights.take(unit_of(R::final_norm_weight));
  grads.take(unit_of(R::final_norm_weight));
  Buffer dresidual = backend_.alloc(MemCategory::workspace, backend_.compute_dtype(),
                                    {rows, model_config_.d_model}, "d residual");
  final_norm_backward(dhidden, dresidual);
  dhidden.reset();

  int64_t input_back = 0;  // offload_moves_: the copy that brings this layer's input back
  for (int layer = model_config_.n_layers - 1; layer >= 0; --layer) {
    weights.take(layer_unit(layer));
    grads.take(layer_unit(layer));
    if (offload_moves_) {
      // The last layer's input is still on the device; every other one was brought back
      // while the layer after it ran its backward. The next one comes back during this one.
      backend_.wait_transfer(input_back);
      if (layer >= 1)
        input_back = last_transfer_ =
            backend_.transfer(block_input(layer - 1), host_inputs_[size_t(layer - 1)]);
    }
    const LayerTensors layer_weights = layer_view(layer, false);
    // The shared set still holds the last block's activations from the forward pass.
    // Recomputing writes the same bits into the block's output, no longer needed (a tiled
    // MLP is not recomputed here: its backward does it tile by tile).
    if (recompute_ && layer != model_config_.n_layers - 1) {
      Profiler::Scope recompute(backend_.profiler(), phase::kRecompute, Profiler::Kind::absorbing);
      block_.recompute(
          layer_weights, shape_, block_input(layer),
          offload_moves_ ? recompute_out_.tensor() : residuals_[size_t(layer + 1)].tensor(),
          acts_[0]);
    }
    block_.backward(layer_weights, layer_view(layer, true), shape_, block_input(layer),
                    activations(layer), dresidual);
  }

  weights.take(unit_of(R::token_embedding));
  grads.take(unit_of(R::token_embedding));
  {
    Profiler::Scope embedding(backend_.profiler(), phase::kEmbedding);
    embed_backward(
        dresidual.tensor().reshape({shape_.batch, shape_.seq_local, model_config_.d_model}));
  }
  grads.finish();
  weights.finish();
  return loss;
}

LossResult Model::evaluate(const MicroBatch& batch) {
  WeightPipeline weights(state_, unit_plan(false), prefetch_ ? 1 : 0);
  forward(batch, weights);
  weights.take(unit_of(lm_head_role()));
  Profiler::Scope scope(backend_.profiler(), phase::kLoss, Profiler::Kind::compute, 0,
                        lm_head_flops(false));
  const LossResult loss = backend_.lm_head_loss(final_norm_out_, weight(lm_head_role()), targets_,
                                                loss_tile_tokens_, 1.0f, Tensor(), Tensor());
  final_norm_out_.reset();
  return loss;
}

std::vector<float> Model::logits(const MicroBatch& batch, const std::vector<int64_t>& rows) {
  WeightPipeline weights(state_, unit_plan(false), prefetch_ ? 1 : 0);
  forward(batch, weights);
  weights.take(unit_of(lm_head_role()));
  // One row of logits at a time: the fused loss never holds them (docs/design.md), and a
  // sampler needs only the few rows it draws from.
  const int64_t vocab = model_config_.vocab_size;
  Buffer row_logits = backend_.alloc(MemCategory::workspace, DType::f32, {1, vocab}, "logits");
  std::vector<float> host(rows.size() * size_t(vocab));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= shape_.batch * shape_.seq_local)
      throw std::logic_error("logits of row " + std::to_string(rows[i]) + ", outside the " +
                             std::to_string(shape_.batch * shape_.seq_local) +
                             " rows of the micro-batch");
    backend_.gemm(final_norm_out_.tensor().slice_rows(rows[i], rows[i] + 1), false,
                  weight(lm_head_role()), true, row_logits, 1.0f, 0.0f);
    backend_.download(host.data() + i * size_t(vocab), row_logits);
  }
  final_norm_out_.reset();
  return host;
}

}  // namespace ulysses
