#include "core/jobs/eval_job.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/jobs/job_session.h"
#include "core/jobs/memory_fit.h"
#include "parallel/agreement.h"
#include "parallel/mesh.h"
#include "parallel/sequence_padding.h"

namespace ulysses {
namespace {

std::string weights_argument(const WeightSource& source) {
  if (!source.init_from.empty()) return "--init-from " + source.init_from;
  if (!source.checkpoint.empty()) return "--checkpoint " + source.checkpoint;
  return "train.checkpoint.dir";
}

// Collective: the validation split, or JobError(bad_input) on every rank when it cannot be
// read.
std::unique_ptr<Dataset> open_validation_data(const Config& config, Comm& world) {
  std::unique_ptr<Dataset> dataset;
  std::string error;
  try {
    dataset = make_dataset(config.data, Split::val, config.train.seq_len, config.model.vocab_size,
                           config.train.seed);
  } catch (const DataError& problem) {
    error = problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  return dataset;
}

}  // namespace

EvalResult run_eval(const EvalOptions& options, Comm& world) {
  JobSession job = open_job(options.config_path, options.overrides,
                            "eval " + weights_argument(options.weights), world);
  connect_job(job, world);
  const Config& config = job.config;
  const TrainConfig& train = config.train;
  const OpenedWeights weights = open_weight_source(options.weights, config, world);
  check_eval_fits(world, config, omp_get_max_threads(), rank_memory(world, *job.backend),
                  host_rank_memory(world));
  const int64_t seq_local = padded_seq_local(train.seq_len, job.mesh.sp_size, job.mesh.ring_size);
  Model model(config, *job.backend, *job.mesh.sp, *job.mesh.world, train.batch_size, seq_local,
              ring_comms(job.mesh));
  {
    Watchdog::SlowWork slow(job.watchdog.get(), "loading the weights");
    load_opened_weights(weights, model);
  }
  std::unique_ptr<Dataset> dataset = open_validation_data(config, world);
  const EvalResult result =
      evaluate_model(model, *dataset, job.mesh, train.batch_size, train.seq_len, train.eval_steps);

  if (world.rank() != 0) return result;
  const std::string split = config.data.val_path.empty() ? "held-out" : "data.val_path";
  const int64_t sequences = int64_t(train.eval_steps) * train.batch_size * job.mesh.dp_size;
  if (options.json) {
    nlohmann::json line = {{"weights", weights.path},   {"split", split},
                           {"loss", result.loss},       {"perplexity", std::exp(result.loss)},
                           {"tokens", result.tokens},   {"sequences", sequences},
                           {"world", world.size()},     {"sp", job.mesh.sp_size},
                           {"ring", job.mesh.ring_size}};
    if (result.accuracy >= 0) line["accuracy"] = result.accuracy;
    std::cout << line.dump() << std::endl;
  } else {
    const std::string accuracy =
        result.accuracy >= 0 ? fmt::format(" | acc {:5.1f}%", 100.0 * result.accuracy) : "";
    spdlog::info("eval of {} on the {} split ({} sequences of {} tokens, world {} = {})",
                 weights.path, split, sequences, train.seq_len, world.size(),
                 mesh_text(world.size(), job.mesh.sp_size, job.mesh.ring_size));
    spdlog::info("eval loss {:.4f} | perplexity {:.3f} | {} tokens{}", result.loss,
                 std::exp(result.loss), result.tokens, accuracy);
  }
  return result;
}

}  // namespace ulysses
