#include "core/train/trainer.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/checkpoint/checkpoint_space.h"
#include "core/checkpoint/weights_io.h"
#include "core/checkpoint/weights_source.h"
#include "core/config/seq_len_schedule.h"
#include "core/report/trace_file.h"
#include "core/train/optimizer_step.h"
#include "core/train/resume_warnings.h"
#include "core/train/stop_signal.h"
#include "kernels/stopwatch.h"
#include "parallel/agreement.h"
#include "parallel/mpi_comm.h"
#include "parallel/sequence_padding.h"
#include "parallel/watchdog.h"

namespace ulysses {

namespace {

std::string format_duration(double seconds) {
  long total = long(std::lround(seconds));
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof text, "%ldh%02ldm", total / 3600, (total / 60) % 60);
  } else if (total >= 60) {
    std::snprintf(text, sizeof text, "%ldm%02lds", total / 60, total % 60);
  } else {
    std::snprintf(text, sizeof text, "%lds", total);
  }
  return text;
}

}  // namespace

CommStats sum_stats(const std::vector<const Comm*>& comms) {
  CommStats total;
  for (const Comm* comm : comms) total += comm->stats();
  return total;
}

Trainer::Trainer(const Config& config, Backend& backend, Mesh& mesh)
    : config_(config),
      backend_(backend),
      mesh_(mesh),
      seq_len_stages_(parse_seq_len_schedule(config.train.seq_len_schedule)),
      guard_(config.train, config.model.vocab_size) {
  // The mesh decides how attention is split, whatever the config says: one made for another
  // sp or ring would train, or plan, something other than what the config names.
  if (mesh.sp_size != config.parallel.sp || mesh.ring_size != config.parallel.ring)
    throw std::invalid_argument(
        "the trainer's mesh is sp " + std::to_string(mesh.sp_size) + " x ring " +
        std::to_string(mesh.ring_size) + ", its config parallel.sp " +
        std::to_string(config.parallel.sp) + " and parallel.ring " +
        std::to_string(config.parallel.ring) +
        ": make the mesh with make_mesh(world, parallel.sp, parallel.ring)");
  const TrainConfig& train = config.train;
  const Stopwatch clock;
  // A plan is for the last stage of a curriculum, at the full length.
  const int64_t last_step = std::numeric_limits<int64_t>::max();
  build_model(stage_at(seq_len_stages_, train.seq_len, train.batch_size,
                       backend.memory().planning() ? last_step : 0));
  optimizer_ = std::make_unique<AdamW>(backend, model_->table(), train, model_->state().layout());
  if (backend.memory().planning()) return;
  // Each stage's time includes its device work (the zero fills, the uploads).
  backend.synchronize();
  const double buffers = clock.seconds();
  model_->init_weights(train.seed);
  backend.synchronize();
  const double weights = clock.seconds() - buffers;
  open_data();
  checkpointer_ = std::make_unique<Checkpointer>(config, backend, *mesh.world);
  if (mesh.world->rank() == 0)
    spdlog::info(
        "startup: model and optimizer buffers in {:.2f} s, initial weights in {:.2f} s ({:.2f} GB "
        "of f32 made and uploaded per rank), data in {:.2f} s",
        buffers, weights, 4e-9 * double(model_->state().layout().shard_numel()),
        clock.seconds() - buffers - weights);
}

void Trainer::build_model(const SeqLenStage& stage) {
  seq_len_ = stage.seq_len;
  batch_size_ = stage.batch_size;
  seq_local_ = padded_seq_local(seq_len_, mesh_.sp_size, mesh_.ring_size);
  model_ = std::make_unique<Model>(config_, backend_, *mesh_.sp, *mesh_.world, batch_size_,
                                   seq_local_, ring_comms(mesh_));
}

void Trainer::open_data() {
  const TrainConfig& train = config_.train;
  {
    Watchdog::SlowWork slow(mesh_.world->watchdog().get(), "opening the data");
    train_data_ =
        make_dataset(config_.data, Split::train, seq_len_, config_.model.vocab_size, train.seed);
    if (train.eval_every > 0)
      val_data_ =
          make_dataset(config_.data, Split::val, seq_len_, config_.model.vocab_size, train.seed);
  }
  check_same_data(*train_data_, "training");
  if (val_data_) check_same_data(*val_data_, "validation");
}

void Trainer::follow_seq_len_schedule() {
  const SeqLenStage stage =
      stage_at(seq_len_stages_, config_.train.seq_len, config_.train.batch_size, step_);
  if (stage.seq_len == seq_len_ && stage.batch_size == batch_size_) return;
  const int64_t previous_len = seq_len_, previous_batch = batch_size_;
  // The weights move to the model built for the new shape through the host, each rank with
  // only the ranges it stores (the new model stores the same ones: the parameter layout does
  // not depend on the shape); the optimizer's moments stay where they are.
  StoredWeights stored;
  model_->state().download_stored_weights(
      [&](int64_t begin, int64_t count, const float* values) { stored.add(begin, count, values); });
  model_.reset();        // before the new one: the two are never allocated at once
  stage_seconds_ = 0.0;  // the ETA follows the new stage's step time
  stage_steps_ = 0;
  build_model(stage);
  model_->load_weights(
      [&](int64_t begin, int64_t count, float* out) { stored.read(begin, count, out); });
  open_data();
  if (mesh_.world->rank() == 0)
    spdlog::info("seq_len {} x batch {} -> {} x {} from step {} (train.seq_len_schedule): {}",
                 previous_len, previous_batch, seq_len_, batch_size_, step_ + 1,
                 tokens_per_rank_text(seq_len_, mesh_.sp_size, mesh_.ring_size));
}

void Trainer::check_same_data(const Dataset& dataset, const char* split) const {
  const double sequences = double(dataset.num_sequences());
  double range[2] = {sequences, -sequences};  // max and -min over the ranks
  Watchdog::SlowWork slow(mesh_.world->watchdog().get(), "opening the data");
  mesh_.world->all_reduce_host(range, 2, ReduceOp::max);
  std::string error;
  if (range[0] != -range[1])
    error = std::string("the ranks see different ") + split + " data (" +
            name_of(config_.data.source) + " at data.path '" + config_.data.path + "'): from " +
            std::to_string(int64_t(-range[1])) + " to " + std::to_string(int64_t(range[0])) +
            " sequences; a file changed while the job started, or the nodes see different files";
  agree_on_failure(*mesh_.world, error, ExitCode::bad_input);
}

void Trainer::set_phase(const char* phase) const {
  if (Watchdog* watchdog = mesh_.world->watchdog().get()) watchdog->set_phase(phase);
}

void Trainer::load_initial_weights() {
  const std::string& path = config_.model.init_from;
  if (path.empty()) return;
  const OpenedWeights weights =
      open_agreed_weights(*mesh_.world, path, resolve_weights_path, config_.model);
  load_opened_weights(weights, *model_);
  if (mesh_.world->rank() == 0) spdlog::info("initial weights from {}", weights.path);
}

void Trainer::resume(const std::string& folder) {
  const TrainerState state = checkpointer_->load(folder, *model_, optimizer_->moments());
  step_ = state.step;
  last_loss_ = state.loss;
  guard_.resumed(folder, state.step, state.guard);
  if (mesh_.world->rank() != 0) return;
  spdlog::info("resumed from {} at step {} (written by world {} = sp {} x dp {}, ZeRO stage {})",
               folder, step_, state.world_size, state.sp, state.world_size / state.sp,
               state.zero_stage);
  for (const std::string& warning :
       resume_warnings(config_, state, mesh_.dp_size, seq_len_, *train_data_))
    spdlog::warn("{}", warning);
}

std::string Trainer::save_checkpoint() {
  const Stopwatch clock;
  CheckpointProgress progress;
  progress.step = step_;
  progress.loss = last_loss_;
  progress.guard = guard_.record();
  progress.good_folder = guard_.good_checkpoint();
  progress.seq_len = seq_len_;
  progress.train_sequences = train_data_->num_sequences();
  std::string folder = checkpointer_->save(progress, *model_, optimizer_->moments());
  guard_.checkpoint_saved(step_, folder);
  if (mesh_.world->rank() == 0)
    spdlog::info("checkpoint {} written in {:.2f} s", folder, clock.seconds());
  return folder;
}

void Trainer::replace_after_first_save(std::vector<std::string> folders) {
  checkpointer_->replace_after_first_save(std::move(folders));
}

StepResult Trainer::train_step() {
  const TrainConfig& train = config_.train;
  const Stopwatch clock;
  Comm& world = *mesh_.world;
  Profiler& profiler = backend_.profiler();
  Profiler::Scope step_scope(profiler, phase::kStep);
  if (Watchdog* watchdog = world.watchdog().get()) watchdog->set_step(step_ + 1);

  // Read every micro-batch first: the loss is a mean over all counted tokens of the global
  // batch, so its scale must be known before the first backward.
  set_phase("reading data");
  std::vector<MicroBatch> micro_batches;
  double counted = 0.0;
  {
    Profiler::Scope data(profiler, phase::kData);
    for (int micro = 0; micro < train.grad_accum; ++micro) {
      int64_t first_sequence =
          ((step_ * train.grad_accum + micro) * mesh_.dp_size + mesh_.dp_rank) * batch_size_;
      micro_batches.push_back(read_micro_batch(*train_data_, first_sequence, batch_size_, seq_len_,
                                               mesh_.sp_size, mesh_.ring_size, mesh_.sp_rank));
      for (int32_t target : micro_batches.back().targets) counted += target >= 0 ? 1.0 : 0.0;
    }
  }
  {
    Profiler::Scope reduce(profiler, phase::kScalarAllReduce, Profiler::Kind::communication);
    world.all_reduce_host(&counted, 1, ReduceOp::sum);
  }
  if (counted == 0.0)
    throw std::runtime_error("the batch of step " + std::to_string(step_ + 1) +
                             " has no token with a target");
  StepResult result = compute_step(micro_batches, counted);
  result.step_seconds = clock.seconds();
  return result;
}

StepResult Trainer::plan_step() {
  if (!backend_.memory().planning())
    throw std::logic_error("Trainer::plan_step outside planning mode");
  const TrainConfig& train = config_.train;
  // Shapes only: a planned step has no tokens (Model::forward uploads none), so the plan's
  // own memory does not grow with seq_len.
  MicroBatch batch;
  batch.batch = batch_size_;
  batch.seq_local = seq_local_;
  batch.pos_offset = int64_t(mesh_.sp_rank) * seq_local_;
  const std::vector<MicroBatch> micro_batches(size_t(train.grad_accum), batch);
  return compute_step(micro_batches, double(train.grad_accum) * double(batch.batch * seq_local_));
}

StepResult Trainer::compute_step(const std::vector<MicroBatch>& micro_batches, double counted) {
  const TrainConfig& train = config_.train;
  Comm& world = *mesh_.world;
  Profiler& profiler = backend_.profiler();
  set_phase("forward and backward");
  model_->zero_grads();
  double totals[3] = {0.0, 0.0, 0.0};  // loss sum, counted tokens, correct answers
  for (const MicroBatch& batch : micro_batches) {
    LossResult loss = model_->forward_backward(batch, float(1.0 / counted));
    totals[0] += loss.loss_sum;
    totals[1] += double(loss.count);
    totals[2] += double(loss.correct);
  }
  set_phase("loss and gradient reduction");
  {
    Profiler::Scope reduce(profiler, phase::kScalarAllReduce, Profiler::Kind::communication);
    world.all_reduce_host(totals, 3, ReduceOp::sum);
  }

  StepResult result;
  result.step = step_ + 1;
  result.lr = learning_rate(train, step_);
  result.loss = totals[0] / totals[1];
  if (train_data_ && train_data_->has_answers()) result.accuracy = totals[2] / totals[1];
  result.tokens = int64_t(train.grad_accum) * batch_size_ * mesh_.dp_size * seq_len_;
  const OptimizerStepResult update = take_optimizer_step(
      *model_, *optimizer_, guard_, backend_, world, train, result.loss, result.lr, step_);
  result.grad_norm = update.grad_norm;
  result.spike = update.spike;
  result.skipped = !update.updated();
  if (result.skipped)
    handle_bad_step(result, update);
  else
    skipped_in_a_row_ = 0;
  backend_.synchronize();
  ++step_;
  last_loss_ = result.skipped ? std::nullopt : std::optional<double>(result.loss);
  return result;
}

void Trainer::handle_bad_step(const StepResult& result, const OptimizerStepResult& update) {
  auto show = [](double value) {
    return std::isnan(value) ? std::string("NaN") : fmt::format("{:.6g}", value);
  };
  const std::string what =
      update.nonfinite ? fmt::format("step {}: the loss is {} and the gradient norm is {}; {}",
                                     result.step, show(result.loss), show(result.grad_norm),
                                     update.nonfinite_tensor.empty()
                                         ? "every gradient element is finite"
                                         : "the first tensor with a non-finite gradient is " +
                                               update.nonfinite_tensor)
                       : fmt::format("step {}: a spike: {}", result.step, update.spike_reason);
  const bool rank0 = mesh_.world->rank() == 0;
  if (config_.train.on_nonfinite == OnNonfinite::abort)
    throw JobError(ExitCode::nonfinite,
                   what + ". Stopping without saving this state (train.on_nonfinite: abort); " +
                       "the checkpoints written so far are intact. " + guard_.go_back_advice() +
                       "; or set train.on_nonfinite: skip to drop such steps",
                   rank0);
  ++skipped_in_a_row_;
  if (skipped_in_a_row_ > config_.train.max_skipped_steps)
    throw JobError(ExitCode::nonfinite,
                   what + ". That is " + std::to_string(skipped_in_a_row_) +
                       " non-finite or spike steps in a row, more than train.max_skipped_steps = " +
                       std::to_string(config_.train.max_skipped_steps) +
                       "; stopping without saving this state. " + guard_.go_back_advice(),
                   rank0);
  if (rank0)
    spdlog::warn("{}: update skipped ({} in a row; train.on_nonfinite: skip)", what,
                 skipped_in_a_row_);
}

EvalResult Trainer::evaluate() {
  const TrainConfig& train = config_.train;
  // Once per length: where the keys of the evaluated sequences sit, which rank asks.
  if (mesh_.world->rank() == 0 && val_data_->has_answers() && placement_logged_at_ != seq_len_) {
    const int64_t sequences = int64_t(train.eval_steps) * mesh_.dp_size * batch_size_;
    spdlog::info("eval sequences at {} tokens over sp {}: {}", seq_len_, mesh_.sp_size,
                 describe_placement(query_placement(*val_data_, sequences, seq_len_, mesh_.sp_size,
                                                    mesh_.ring_size)));
    placement_logged_at_ = seq_len_;
  }
  return evaluate_model(*model_, *val_data_, mesh_, batch_size_, seq_len_, train.eval_steps);
}

Trainer::StepRecord Trainer::record_step(const StepResult& result, const CommStats& comm,
                                         const ProfileTotals& phases,
                                         double readback_seconds) const {
  StepRecord record{result, comm, phases, nlohmann::json::object(), readback_seconds};
  const std::vector<std::string>& names = step_phases();
  std::vector<double> seconds;
  for (const std::string& name : names) {
    auto found = phases.phases.find(name);
    seconds.push_back(found == phases.phases.end() ? 0.0 : found->second.seconds);
  }
  mesh_.world->all_reduce_host(seconds.data(), int(seconds.size()), ReduceOp::max);
  for (size_t i = 0; i < names.size(); ++i)
    if (seconds[i] > 0)
      record.phases_max[names[i] == phase::kStep ? "other" : names[i]] = seconds[i];
  return record;
}

void Trainer::start_profiling() {
  Profiler& profiler = backend_.profiler();
  verdict_context_.sp = mesh_.sp_size;
  verdict_context_.ranks_on_node = ranks_on_this_node(*mesh_.world);
  verdict_context_.cores_on_node = int(std::thread::hardware_concurrency());
  verdict_context_.limit_bytes = backend_.memory().limit();
  verdict_context_.native_attention = config_.kernels.attention == AttentionKernel::native;
  // The all-to-all of one q tensor: B·Tl·H·d elements.
  verdict_context_.bare_all_to_all_bytes =
      batch_size_ * seq_local_ * config_.model.d_model * int64_t(sizeof(float));
  verdict_context_.bare_all_to_all_gbps =
      measure_all_to_all_gbps(*mesh_.sp, backend_, verdict_context_.bare_all_to_all_bytes);
  profiler.set_device_timing(config_.log.device_timing);
  mesh_.world->barrier();
  profiler.reset_origin();
  profiler.take_totals();
  profiler.take_trace();
  profiler.set_trace(!config_.log.trace_file.empty());
}

Verdict Trainer::current_verdict() {
  verdict_context_.peak_bytes = backend_.memory().stats().total_peak;
  const ProfileTotals mean = profile_.mean_over_ranks(*mesh_.world);
  double step_seconds = profile_.seconds();
  mesh_.world->all_reduce_host(&step_seconds, 1, ReduceOp::sum);
  return judge(mean, step_seconds / mesh_.world->size(), profile_.steps(), verdict_context_);
}

void Trainer::finish_profiling() {
  Profiler& profiler = backend_.profiler();
  if (profiler.tracing()) {
    const std::vector<TraceSpan> rest = profiler.take_trace();
    trace_.insert(trace_.end(), rest.begin(), rest.end());
  }
  profiler.set_trace(false);
  profiler.set_device_timing(false);  // no one takes the device's spans after the last step
  if (!config_.log.trace_file.empty()) {
    write_trace_file(*mesh_.world, trace_, config_.log.trace_file);
    if (mesh_.world->rank() == 0)
      spdlog::info("trace of the first {} step(s) written to {}",
                   std::min<int64_t>(config_.log.trace_steps, profile_.steps()),
                   config_.log.trace_file);
  }
  if (profile_.steps() == 0) return;
  const std::string table = profile_.table(*mesh_.world);
  const Verdict verdict = current_verdict();
  if (mesh_.world->rank() == 0) {
    spdlog::info("{}", table.substr(0, table.size() - 1));
    spdlog::info("verdict: {}: {}", verdict.kind, verdict.line);
  }
}

void Trainer::log_step(const StepRecord& record) {
  const StepResult& r = record.result;
  const CommStats& comm = record.comm;
  const ProfileTotals& phases = record.phases;
  const double comm_wait_seconds = waiting_seconds(phases);
  stage_seconds_ += r.step_seconds;
  ++stage_steps_;
  const MemoryStats& memory = backend_.memory().stats();
  if (metrics_) {
    nlohmann::json line = {{"step", r.step},
                           {"loss", r.loss},
                           {"lr", r.lr},
                           {"grad_norm", r.grad_norm},
                           {"tokens", r.tokens},
                           {"tokens_per_s", double(r.tokens) / r.step_seconds},
                           {"step_ms", r.step_seconds * 1e3},
                           {"mem_peak_bytes", memory_peaks_json(memory)},
                           {"all_to_all_bytes", comm.all_to_all_bytes},
                           {"all_to_all_s", comm.all_to_all_seconds},
                           {"grad_comm_bytes", comm.reduce_bytes + comm.gather_bytes},
                           {"grad_comm_s", comm.reduce_seconds + comm.gather_seconds},
                           {"comm_wait_s", comm_wait_seconds}};
    if (mesh_.ring) {  // parallel.ring > 1: ring attention's point to point
      line["ring_p2p_bytes"] = comm.p2p_bytes;
      line["ring_p2p_s"] = comm.p2p_seconds;
    }
    if (r.accuracy >= 0) line["accuracy"] = r.accuracy;
    if (r.skipped) line["skipped"] = true;
    if (r.spike) line["spike"] = true;
    line["phases"] = phases_json(phases);
    line["phases_max_s"] = record.phases_max;
    if (phases.device_timed) {
      line["device_busy"] = phases.device_busy_seconds / r.step_seconds;
      line["launches"] = phases.launches;
      line["device_readback_ms"] = record.readback_seconds * 1e3;
    }
    metrics_->write(line);
  }
  const int every = config_.log.every;
  if (mesh_.world->rank() != 0 || (r.step % every != 0 && r.step != config_.train.steps)) return;
  const double eta = remaining_seconds(
      seq_len_stages_, config_.train.seq_len, config_.train.batch_size, r.step, config_.train.steps,
      {seq_len_, 0, batch_size_}, stage_seconds_ / double(stage_steps_));
  std::string accuracy = r.accuracy >= 0 ? fmt::format(" | acc {:5.1f}%", 100.0 * r.accuracy) : "";
  spdlog::info(
      "step {:>{}}/{} | loss {:.4f}{} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | {:.0f} ms | "
      "comm wait {:.0f}% | mem {} | ETA {}",
      r.step, int(std::to_string(config_.train.steps).size()), config_.train.steps, r.loss,
      accuracy, r.lr, r.grad_norm, double(r.tokens) / r.step_seconds, r.step_seconds * 1e3,
      100.0 * comm_wait_seconds / r.step_seconds, format_bytes(memory.total_peak),
      format_duration(eta));
}

bool Trainer::agree_on_stop() const {
  // A signal may reach some ranks only: agree on stopping before anyone acts on it.
  set_phase("agreeing on a stop signal");
  double stop = stop_requested() ? 1.0 : 0.0;
  mesh_.world->all_reduce_host(&stop, 1, ReduceOp::max);
  return stop > 0.0;
}

void Trainer::run() {
  const TrainConfig& train = config_.train;
  const CheckpointConfig& checkpoint = train.checkpoint;
  std::string in_use, failed;
  if (mesh_.world->rank() == 0) {
    try {
      metrics_ = std::make_unique<MetricsWriter>(
          config_.log.metrics_file, step_ > 0 ? std::optional<int64_t>(step_) : std::nullopt);
    } catch (const MetricsFileInUse& problem) {
      in_use = problem.what();
    } catch (const std::exception& problem) {
      failed = problem.what();
    }
  }
  agree_on_failure(*mesh_.world, in_use, ExitCode::bad_input);
  agree_on_failure(*mesh_.world, failed, ExitCode::runtime);
  std::vector<const Comm*> comms = {mesh_.world, mesh_.sp.get(), mesh_.dp.get()};
  if (mesh_.ring) comms.insert(comms.end(), {mesh_.ulysses.get(), mesh_.ring.get()});
  if (step_ >= train.steps) {
    if (mesh_.world->rank() == 0)
      spdlog::info("checkpoint at step {}, train.steps is {}: nothing to train", step_,
                   train.steps);
    return;
  }
  // A signal during start-up (which takes minutes for a large model) has no step to finish,
  // and the state is still the one this run started from: nothing to save.
  if (agree_on_stop()) {
    if (mesh_.world->rank() == 0)
      spdlog::warn(
          "stop requested (signal) before the first step of this run, at step {}: "
          "nothing new to save, exiting",
          step_);
    return;
  }
  start_profiling();
  Profiler& profiler = backend_.profiler();
  while (step_ < train.steps) {
    follow_seq_len_schedule();
    backend_.memory().reset_peaks();
    profiler.take_totals();  // evaluation and checkpoints between steps are not step phases
    CommStats before = sum_stats(comms);
    StepResult result = train_step();
    // After the step's synchronisation: the device's times are read back here, once.
    const Stopwatch readback;
    const ProfileTotals phases = profiler.take_totals();
    const double readback_seconds = readback.seconds();
    profile_.add_step(phases, result.step_seconds);
    if (profiler.tracing() && profile_.steps() == config_.log.trace_steps) {
      trace_ = profiler.take_trace();
      profiler.set_trace(false);
    }
    log_step(record_step(result, sum_stats(comms) - before, phases, readback_seconds));
    const std::string plans = backend_.take_plans_built();
    if (!plans.empty() && mesh_.world->rank() == 0)
      spdlog::info("step {} built {} (the first use of each shape)", step_, plans);
    if (config_.log.verdict_every > 0 && step_ % config_.log.verdict_every == 0) {
      const Verdict verdict = current_verdict();
      if (mesh_.world->rank() == 0)
        spdlog::info("verdict after step {}: {}: {}", step_, verdict.kind, verdict.line);
    }
    if (train.eval_every > 0 && (step_ % train.eval_every == 0 || step_ == train.steps)) {
      set_phase("evaluation");
      EvalResult eval = evaluate();
      if (metrics_) {
        nlohmann::json line = {
            {"step", step_}, {"eval_loss", eval.loss}, {"eval_tokens", eval.tokens}};
        if (eval.accuracy >= 0) line["eval_accuracy"] = eval.accuracy;
        metrics_->write(line);
      }
      if (mesh_.world->rank() == 0) {
        std::string accuracy =
            eval.accuracy >= 0 ? fmt::format(" | eval acc {:5.1f}%", 100.0 * eval.accuracy) : "";
        spdlog::info("eval at step {} | eval loss {:.4f}{}", step_, eval.loss, accuracy);
      }
    }
    bool save_now = !checkpoint.dir.empty() && is_checkpoint_step(checkpoint, step_, train.steps);
    if (agree_on_stop()) {
      if (mesh_.world->rank() == 0)
        spdlog::warn("stop requested (signal); {} at step {}",
                     checkpoint.dir.empty() ? "no train.checkpoint.dir, exiting"
                                            : "writing a checkpoint and exiting",
                     step_);
      if (!checkpoint.dir.empty()) save_checkpoint();
      finish_profiling();
      return;
    }
    if (save_now) save_checkpoint();
  }
  finish_profiling();
}

}  // namespace ulysses
