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
#include "core/memory_plan.h"
#include "core/metrics.h"
#include "core/trainer.h"
#include "parallel/mesh.h"
#include "parallel/watchdog.h"

namespace ulysses {
namespace {

// Prints the resolved config, the parameter count and the planner's bytes per category:
// the persistent buffers and a step's peak, charged by the trainer on the planning backend
// (core/memory_plan.h), so it needs no device, not even for device: cuda.
void print_plan(const Config& config, int world_size) {
  const MemoryPlan plan = plan_memory(config, world_size, 1);
  std::cout << "# resolved config\n" << config_to_yaml(config) << "\n";
  std::cout << "# model: " << name_of(config.model.family) << ", " << plan.num_params
            << " parameters (" << format_bytes(plan.num_params * 4) << " in fp32)\n";
  std::cout << "# world " << world_size << " = dp " << world_size / config.parallel.sp << " x sp "
            << config.parallel.sp << "; each rank holds " << config.train.batch_size << " x "
            << config.train.seq_len / config.parallel.sp << " tokens per micro-step\n";
  std::cout << "# ZeRO stage " << plan.zero_stage << ": " << plan.zero_units << " units (largest "
            << plan.largest_unit << " parameters, bucket_mb " << config.parallel.bucket_mb
            << "); each rank owns " << plan.shard_numel << " parameters of state\n";
  std::cout << "# planned tracked memory per rank on " << name_of(config.device)
            << " (persistent buffers, then the peak of a step; docs/memory.md):\n";
  for (int i = 0; i < kNumMemCategories; ++i)
    std::cout << "#   " << mem_category_name(MemCategory(i)) << ": "
              << format_bytes(plan.persistent[i]) << ", step peak " << format_bytes(plan.peak[i])
              << "\n";
  int64_t persistent_total = 0;
  for (int i = 0; i < kNumMemCategories; ++i)
    if (is_device_memory(MemCategory(i))) persistent_total += plan.persistent[i];
  std::cout << "#   total: " << format_bytes(persistent_total) << ", step peak "
            << format_bytes(plan.device_peak) << "\n";
  std::cout << "# sent per step per rank: all-to-all " << format_bytes(plan.all_to_all_bytes)
            << "; more in ulysses-train plan --help\n";
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
  // --dry-run plans without a backend, so device: cuda is planned on any machine.
  JobSession job = open_job(options.config_path, options.overrides, options.resume.value_or(""),
                            world, !options.dry_run);
  const Config& config = job.config;
  if (options.dry_run) {
    if (world.rank() == 0) print_plan(config, world.size());
    return;
  }
  connect_job(job, world);
  Mesh& mesh = job.mesh;
  if (world.rank() == 0)
    spdlog::info(
        "ulysses-train {}: {} model, world {} = dp {} x sp {}, ZeRO stage {}, device {}, {}",
        ulysses_version(), name_of(config.model.family), world.size(), mesh.dp_size, mesh.sp_size,
        world.size() > 1 ? config.parallel.zero_stage : 0, job.backend->name(),
        job.progress_thread ? "a progress thread per rank" : "no progress thread");
  const std::string setup_warning = job.backend->setup_warning();
  if (world.rank() == 0 && !setup_warning.empty()) spdlog::warn("{}", setup_warning);
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
    spdlog::info(
        "{} parameters; seq_len {} ({} tokens per rank), batch {} x grad_accum {}; loss tiles of "
        "{} tokens{}",
        trainer.model().num_params(), config.train.seq_len, config.train.seq_len / mesh.sp_size,
        config.train.batch_size, config.train.grad_accum, trainer.model().loss_tile_tokens(),
        config.memory.loss_tile_tokens == 0 ? " (memory.loss_tile_tokens: auto)" : "");
  trainer.run();
}

}  // namespace ulysses
