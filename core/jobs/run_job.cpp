#include "core/jobs/run_job.h"

#include <omp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/checkpoint_lock.h"
#include "core/checkpoint/checkpoint_space.h"
#include "core/config/config.h"
#include "core/jobs/job_identity.h"
#include "core/jobs/job_session.h"
#include "core/jobs/memory_fit.h"
#include "core/jobs/start_checks.h"
#include "core/plan/memory_plan.h"
#include "core/report/metrics.h"
#include "core/train/trainer.h"
#include "kernels/stopwatch.h"
#include "parallel/agreement.h"
#include "parallel/mesh.h"
#include "parallel/sequence_padding.h"
#include "parallel/watchdog.h"

namespace ulysses {
namespace {

// What the run's checkpoints take on disk (core/checkpoint/checkpoint_space.h).
std::string checkpoint_disk_line(const Config& config, int world_size) {
  const CheckpointConfig& checkpoint = config.train.checkpoint;
  const uint64_t size = checkpoint_bytes(ParamTable(config.model), world_size);
  const std::string each = "about " + format_bytes(int64_t(size)) +
                           " a checkpoint on disk (the weights and two Adam moments in fp32)";
  if (checkpoint.dir.empty()) return each + "; none saved: train.checkpoint.dir is empty";
  const int64_t saves = int64_t(checkpoint_steps(checkpoint, 0, config.train.steps).size());
  const int64_t held = checkpoints_held_at_most(checkpoint, saves);
  return each + "; " + std::to_string(saves) + " saved to '" + checkpoint.dir + "', " +
         (checkpoint.keep_last > 0 ? "keep_last " + std::to_string(checkpoint.keep_last)
                                   : std::string("all kept")) +
         ": up to " + std::to_string(held) + " there at once, " +
         format_bytes(int64_t(double(size) * double(held))) + " (docs/checkpoints.md#disk-space)";
}

// Prints the resolved config, the parameter count and the planner's bytes per category:
// the persistent buffers and a step's peak, charged by the trainer on the planning backend
// (core/plan/memory_plan.h), so it needs no device, not even for device: cuda.
void print_plan(const Config& config, int world_size) {
  const MemoryPlan plan = plan_memory(config, world_size, 1);
  std::cout << "# resolved config\n" << config_to_yaml(config) << "\n";
  std::cout << "# model: " << name_of(config.model.family) << ", " << plan.num_params
            << " parameters (" << format_bytes(plan.num_params * 4) << " in fp32)\n";
  std::cout << "# " << checkpoint_disk_line(config, world_size) << "\n";
  std::cout << "# world " << world_size << " = "
            << mesh_text(world_size, config.parallel.sp, config.parallel.ring)
            << "; each rank holds " << config.train.batch_size << " x "
            << padded_seq_local(config.train.seq_len, config.parallel.sp, config.parallel.ring)
            << " tokens per micro-step";
  const int64_t padded_len =
      padded_seq_len(config.train.seq_len, config.parallel.sp, config.parallel.ring);
  if (padded_len != config.train.seq_len)
    std::cout << " (train.seq_len " << config.train.seq_len << " padded to " << padded_len << ")";
  std::cout << "\n";
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
  if (config.train.seq_len_schedule.empty()) return;
  // The run checks each stage against memory.limit_gib before its first step
  // (core/jobs/memory_fit.h).
  const int64_t limit = memory_limit_bytes(config);
  std::cout << "# train.seq_len_schedule, each stage planned (the plan above is the last):\n";
  for (const StagePlan& stage : plan_stages(config, world_size, 1))
    std::cout << "#   " << stage.stage.seq_len << "x" << stage.stage.batch_size << "@"
              << stage.stage.first_step << ": step peak " << format_bytes(stage.device_peak)
              << (limit > 0 && stage.device_peak > limit ? ", ABOVE memory.limit_gib" : "") << "\n";
}

// How the run's check against the memory this rank can have would go (core/jobs/memory_fit.h):
// on the cpu backend the dry run knows that memory; a cuda config's GPU is not asked for.
void print_machine_fit(const Config& config, int world_size, const RankMemory& memory,
                       const std::string& plan_command) {
  if (memory.bytes <= 0) return;
  const std::vector<StagePlan> stages = plan_stages(config, world_size, omp_get_max_threads());
  const std::string problem = machine_fit_problem(stages, memory, config, world_size, plan_command);
  if (problem.empty()) {
    std::cout << "# this machine: the step peak " << format_bytes(planned_step_peak(stages))
              << " per rank fits " << rank_memory_text(memory) << "\n";
  } else if (memory_limit_bytes(config) > 0) {
    std::cout << "# this machine: memory.limit_gib is set, so the run is held to it, not to this "
                 "machine's memory, which it would not fit (a warning at its start): "
              << problem << "\n";
  } else {
    std::cout << "# this machine: the run would stop before its first step (exit 1): " << problem
              << "\n";
  }
}

// Seconds since this process started (Linux: /proc), or -1 where that is not known.
double seconds_since_launch() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text;
  double up = -1.0;
  if (!std::getline(stat, text) || !(uptime >> up)) return -1.0;
  // Field 22, the start time in clock ticks after boot, counted after the ")" that ends the
  // command name (which may hold spaces).
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  for (int number = 3; number < 22; ++number) fields >> field;
  long long ticks = 0;
  if (!(fields >> ticks)) return -1.0;
  return up - double(ticks) / double(sysconf(_SC_CLK_TCK));
}

// "ulysses-train plan --config FILE" with the job's --set overrides, quoted for a shell.
std::string plan_command(const JobOptions& options) {
  auto quoted = [](const std::string& word) {
    if (word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                               "_-./=:,@+") == std::string::npos)
      return word;
    std::string text = "'";
    for (char c : word) text += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return text + "'";
  };
  std::string command = "ulysses-train plan --config " + quoted(options.config_path);
  for (const std::string& override_text : options.overrides)
    command += " --set " + quoted(override_text);
  return command;
}

}  // namespace

void run_job(const JobOptions& options, Comm& world) {
  // --dry-run plans without a backend, so device: cuda is planned on any machine.
  const Stopwatch clock;
  const std::string command = options.resume ? "train --resume " + *options.resume : "train";
  JobSession job =
      open_job(options.config_path, options.overrides, command, world, !options.dry_run);
  const Config& config = job.config;
  if (options.dry_run) {
    const RankMemory here = config.device == Device::cpu ? host_rank_memory(world) : RankMemory{};
    if (world.rank() == 0) {
      print_plan(config, world.size());
      print_machine_fit(config, world.size(), here, plan_command(options));
    }
    return;
  }
  connect_job(job, world);
  Mesh& mesh = job.mesh;
  if (world.rank() == 0)
    spdlog::info("ulysses-train {}: {} model, world {} = {}, ZeRO stage {}, device {}, {}",
                 ulysses_version(), name_of(config.model.family), world.size(),
                 mesh_text(world.size(), mesh.sp_size, mesh.ring_size),
                 world.size() > 1 ? config.parallel.zero_stage : 0, job.backend->name(),
                 job.progress_thread ? "a progress thread per rank" : "no progress thread");
  if (world.rank() == 0)
    spdlog::info(
        "startup: config, backend and communicators ready in {:.2f} s, {:.2f} s after launch",
        clock.seconds(), seconds_since_launch());
  const std::string setup_note = job.backend->setup_note();
  if (world.rank() == 0 && !setup_note.empty())
    spdlog::info("{}: {}", job.backend->name(), setup_note);
  const std::string setup_warning = job.backend->setup_warning();
  if (world.rank() == 0 && !setup_warning.empty()) spdlog::warn("{}", setup_warning);
  // Before the checkpoint folder is touched: a run that cannot go far leaves it as it was.
  check_run_files(world, config);
  check_stages_fit(world, config, omp_get_max_threads(), plan_command(options),
                   rank_memory(world, *job.backend), host_rank_memory(world));
  CheckpointDirLock checkpoint_lock(
      describe_lock_holder("ulysses-train " + command + " -c " + options.config_path));
  recover_checkpoint_dir(world, config.train.checkpoint.dir, checkpoint_lock);
  const std::string resume_folder =
      options.resume ? agree_resume_folder(world, *options.resume, config.train.checkpoint.dir)
                     : "";
  // At most one optimizer file per rank (ZeRO); their headers are a few KiB each.
  std::vector<std::string> replaced = prepare_checkpoint_dir(
      world, config.train, checkpoint_bytes(ParamTable(config.model), world.size()), resume_folder,
      checkpoint_lock);
  Trainer trainer(config, *job.backend, mesh);
  trainer.replace_after_first_save(std::move(replaced));
  const Stopwatch loading;
  if (resume_folder.empty()) {
    Watchdog::SlowWork slow(job.watchdog.get(), "loading model.init_from");
    trainer.load_initial_weights();
  } else {
    trainer.resume(resume_folder);
  }
  if (world.rank() == 0 && (!resume_folder.empty() || !config.model.init_from.empty()))
    spdlog::info("startup: {} loaded in {:.2f} s",
                 resume_folder.empty() ? "model.init_from" : "the checkpoint", loading.seconds());
  if (world.rank() == 0)
    spdlog::info(
        "{} parameters; seq_len {} ({}), batch {} x grad_accum {}; loss tiles of {} tokens{}",
        trainer.model().num_params(), config.train.seq_len,
        tokens_per_rank_text(config.train.seq_len, mesh.sp_size, mesh.ring_size),
        config.train.batch_size, config.train.grad_accum, trainer.model().loss_tile_tokens(),
        config.memory.loss_tile_tokens == 0 ? " (memory.loss_tile_tokens: auto)" : "");
  trainer.run();
}

}  // namespace ulysses
