#include "core/run_job.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "core/checkpoint.h"
#include "core/config.h"
#include "core/job_agreement.h"
#include "core/job_session.h"
#include "core/metrics.h"
#include "core/params.h"
#include "core/trainer.h"
#include "parallel/mesh.h"
#include "parallel/watchdog.h"

namespace ulysses {
namespace {

// Prints the resolved config, the parameter count and the tracked bytes per category of
// every persistent buffer, charged by a trainer built in planning mode (nothing allocated).
void print_plan(const Config& config, Backend& backend, Mesh& mesh) {
  backend.memory().set_limit(0);
  backend.memory().set_planning(true);
  Trainer planned(config, backend, mesh);
  ParamTable table(config.model);
  if (mesh.world->rank() != 0) return;
  std::cout << "# resolved config\n" << config_to_yaml(config) << "\n";
  std::cout << "# model: " << config.model.family << ", " << table.total_numel() << " parameters ("
            << format_bytes(table.total_numel() * 4) << " in fp32)\n";
  std::cout << "# world " << mesh.world->size() << " = dp " << mesh.dp_size << " x sp "
            << mesh.sp_size << "; each rank holds " << config.train.batch_size << " x "
            << config.train.seq_len / mesh.sp_size << " tokens per micro-step\n";
  const ZeroState& state = planned.model().state();
  const ShardLayout& layout = state.layout();
  int64_t largest_unit = 0;
  for (const ShardUnit& unit : layout.units()) largest_unit = std::max(largest_unit, unit.numel());
  std::cout << "# ZeRO stage " << state.stage() << ": " << layout.units().size()
            << " units (largest " << largest_unit << " parameters, bucket_mb "
            << config.parallel.bucket_mb << "); each rank owns " << layout.shard_numel()
            << " parameters of state\n";
  std::cout << "# planned tracked memory per rank (persistent buffers; kernels add scratch):\n";
  const MemoryStats& stats = backend.memory().stats();
  for (int i = 0; i < kNumMemCategories; ++i)
    std::cout << "#   " << mem_category_name(MemCategory(i)) << ": "
              << format_bytes(stats.current[i]) << "\n";
  std::cout << "#   total: " << format_bytes(stats.total_current) << "\n";
}

// The metrics file is written by rank 0 after every step: found unwritable now, before the
// model is built, rather than after the first step's compute.
void check_metrics_file(Comm& world, const std::string& path) {
  std::string error;
  if (world.rank() == 0 && !path.empty()) {
    std::ofstream probe(path, std::ios::app);
    if (!probe)
      error =
          "log.metrics_file '" + path + "' cannot be opened for writing: " + std::strerror(errno);
  }
  agree_on_failure(world, error, ExitCode::bad_input);
}

}  // namespace

void run_job(const JobOptions& options, Comm& world) {
  JobSession job =
      open_job(options.config_path, options.overrides, options.resume.value_or(""), world);
  const Config& config = job.config;
  if (options.dry_run) {
    Mesh mesh = make_mesh(world, config.parallel.sp);
    print_plan(config, *job.backend, mesh);
    return;
  }
  connect_job(job, world);
  Mesh& mesh = job.mesh;
  if (world.rank() == 0)
    spdlog::info(
        "ulysses-train {}: {} model, world {} = dp {} x sp {}, ZeRO stage {}, device {}, {}",
        ulysses_version(), config.model.family, world.size(), mesh.dp_size, mesh.sp_size,
        world.size() > 1 ? config.parallel.zero_stage : 0, job.backend->name(),
        job.progress_thread ? "a progress thread per rank" : "no progress thread");
  const std::string resume_folder =
      options.resume ? agree_resume_folder(world, *options.resume, config.train.checkpoint.dir)
                     : "";
  prepare_checkpoint_dir(world, config.train.checkpoint, resume_folder);
  check_metrics_file(world, config.log.metrics_file);
  Trainer trainer(config, *job.backend, mesh);
  if (resume_folder.empty()) {
    Watchdog::SlowWork slow(job.watchdog.get(), "loading model.init_from");
    trainer.load_initial_weights();
  } else {
    trainer.resume(resume_folder);
  }
  if (world.rank() == 0)
    spdlog::info("{} parameters; seq_len {} ({} tokens per rank), batch {} x grad_accum {}",
                 trainer.model().num_params(), config.train.seq_len,
                 config.train.seq_len / mesh.sp_size, config.train.batch_size,
                 config.train.grad_accum);
  trainer.run();
}

}  // namespace ulysses
