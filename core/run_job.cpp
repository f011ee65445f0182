#include "core/run_job.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "core/checkpoint.h"
#include "core/config.h"
#include "core/job_agreement.h"
#include "core/memory_plan.h"
#include "core/metrics.h"
#include "core/trainer.h"
#include "kernels/backend.h"
#include "parallel/device_comm.h"
#include "parallel/mesh.h"
#include "parallel/mpi_comm.h"
#include "parallel/progress_thread.h"
#include "parallel/watchdog.h"

namespace ulysses {
namespace {

int64_t memory_limit_bytes(const Config& config) {
  return int64_t(config.memory.limit_gib * 1024.0 * 1024.0 * 1024.0);
}

// Cores of this node for each of its ranks.
int cores_per_rank(Comm& world) {
  const int ranks_here = std::max(1, ranks_on_this_node(world));
  return std::max(1, int(std::thread::hardware_concurrency()) / ranks_here);
}

// parallel.progress_thread: auto runs one where a rank has a core to spare for it (a local
// choice: it changes when collectives advance, never what they compute). Returns whether it
// runs; "on" where it cannot is refused on every rank.
bool start_progress_thread(Comm& world, const std::string& setting, int cores) {
  auto* mpi = dynamic_cast<MpiComm*>(&world);
  const bool possible = world.size() > 1 && mpi && mpi_thread_multiple();
  std::string error;
  if (setting == "on" && !possible)
    error = world.size() == 1 ? "parallel.progress_thread: on, but the job has one rank: "
                                "nothing travels between ranks; use auto or off"
                              : "parallel.progress_thread: on, but this MPI library did not "
                                "grant MPI_THREAD_MULTIPLE; use auto or off";
  agree_on_failure(world, error, ExitCode::bad_input);
  const bool start = possible && (setting == "on" || (setting == "auto" && cores >= 2));
  if (start) mpi->start_progress_thread();
  return start;
}

// Each rank takes its share of the node's cores, less the one a progress thread runs on,
// unless the user set thread counts.
void set_threads(Backend& backend, int cores, bool progress_thread) {
  if (std::getenv("OMP_NUM_THREADS")) return;
  backend.set_num_threads(std::max(1, cores - (progress_thread ? 1 : 0)));
}

// Prints the resolved config, the parameter count and the planner's bytes per category:
// the persistent buffers and a step's peak, charged by the trainer on the planning backend
// (core/memory_plan.h), so it needs no device, not even for device: cuda.
void print_plan(const Config& config, int world_size) {
  const MemoryPlan plan = plan_memory(config, world_size, 1);
  std::cout << "# resolved config\n" << config_to_yaml(config) << "\n";
  std::cout << "# model: " << config.model.family << ", " << plan.num_params << " parameters ("
            << format_bytes(plan.num_params * 4) << " in fp32)\n";
  std::cout << "# world " << world_size << " = dp " << world_size / config.parallel.sp << " x sp "
            << config.parallel.sp << "; each rank holds " << config.train.batch_size << " x "
            << config.train.seq_len / config.parallel.sp << " tokens per micro-step\n";
  std::cout << "# ZeRO stage " << plan.zero_stage << ": " << plan.zero_units << " units (largest "
            << plan.largest_unit << " parameters, bucket_mb " << config.parallel.bucket_mb
            << "); each rank owns " << plan.shard_numel << " parameters of state\n";
  std::cout << "# planned tracked memory per rank on " << config.device
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

// NCCL or staging is decided from every node's view: ranks that share a GPU anywhere make
// every rank stage, since all ranks must build the same kind of communicator.
DeviceCommChoice agree_device_comm(Comm& world, const std::string& setting) {
  const int ranks_here = ranks_on_this_node(world);
  const int gpus_here = cuda_devices_visible();
  double worst_excess = double(ranks_here - gpus_here);
  world.all_reduce_host(&worst_excess, 1, ReduceOp::max);
  // The counts of a node with that excess, for the message.
  double counts[2] = {0.0, 0.0};
  if (double(ranks_here - gpus_here) == worst_excess) counts[0] = ranks_here, counts[1] = gpus_here;
  world.all_reduce_host(counts, 2, ReduceOp::max);
  DeviceCommChoice choice;
  std::string error;
  try {
    choice =
        choose_device_comm(setting, nccl_compiled(), world.size(), int(counts[0]), int(counts[1]));
  } catch (const std::invalid_argument& problem) {
    error = problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  return choice;
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
  auto watchdog = std::make_shared<Watchdog>(ParallelConfig().timeout_s, world.rank());
  watchdog->set_reporter([](const std::string& message) {
    spdlog::error("{}", message);
    spdlog::default_logger()->flush();
  });
  world.set_watchdog(watchdog);

  Config config;
  std::string config_error;
  try {
    config = load_config(options.config_path, options.overrides);
    validate_for_world(config, world.size());
  } catch (const ConfigError& error) {
    config_error = error.what();
  }
  agree_on_failure(world, config_error, ExitCode::bad_input);
  check_same_job(world, job_identity(config, options.resume.value_or("")));
  watchdog->set_timeout(config.parallel.timeout_s);

  if (options.dry_run) {
    if (world.rank() == 0) print_plan(config, world.size());
    return;
  }

  std::unique_ptr<Backend> backend;
  std::string device_error;
  try {
    backend = make_backend(config.device, memory_limit_bytes(config), config.kernels.attention);
  } catch (const DeviceUnavailableError& error) {
    device_error = error.what();
  }
  agree_on_failure(world, device_error, ExitCode::bad_input);

  // Before any split: communicators split from world share its progress thread.
  const int cores = cores_per_rank(world);
  const bool progress_thread = start_progress_thread(world, config.parallel.progress_thread, cores);

  // MPI carries host buffers; device buffers travel over NCCL or are staged through the host.
  Comm* compute_world = &world;
  std::unique_ptr<Comm> device_world;
  if (config.device == "cuda") {
    const DeviceCommChoice choice = agree_device_comm(world, config.parallel.device_comm);
    device_world = make_device_world(world, *backend, choice);
    compute_world = device_world.get();
    if (world.rank() == 0)
      spdlog::info("device buffers between ranks: {} ({})", choice.nccl ? "NCCL" : "MPI staged",
                   choice.reason);
  }
  Mesh mesh = make_mesh(*compute_world, config.parallel.sp);
  set_threads(*backend, cores, progress_thread);
  if (world.rank() == 0)
    spdlog::info(
        "ulysses-train {}: {} model, world {} = dp {} x sp {}, ZeRO stage {}, device {}, {}",
        ulysses_version(), config.model.family, world.size(), mesh.dp_size, mesh.sp_size,
        world.size() > 1 ? config.parallel.zero_stage : 0, backend->name(),
        progress_thread ? "a progress thread per rank" : "no progress thread");
  const std::string resume_folder =
      options.resume ? agree_resume_folder(world, *options.resume, config.train.checkpoint.dir)
                     : "";
  prepare_checkpoint_dir(world, config.train.checkpoint, resume_folder);
  check_metrics_file(world, config.log.metrics_file);
  Trainer trainer(config, *backend, mesh);
  if (resume_folder.empty()) {
    Watchdog::SlowWork slow(watchdog.get(), "loading model.init_from");
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
