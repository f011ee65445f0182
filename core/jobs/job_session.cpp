#include "core/jobs/job_session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/jobs/job_identity.h"
#include "parallel/agreement.h"
#include "parallel/device_comm.h"
#include "parallel/mpi_comm.h"
#include "parallel/progress_thread.h"

namespace ulysses {
namespace {

// Cores of this node for each of its ranks.
int cores_per_rank(Comm& world) {
  const int ranks_here = std::max(1, ranks_on_this_node(world));
  return std::max(1, int(std::thread::hardware_concurrency()) / ranks_here);
}

// parallel.progress_thread: auto runs one where a rank has a core to spare for it (a local
// choice: it changes when collectives advance, never what they compute). Returns whether it
// runs; "on" where it cannot is refused on every rank.
bool start_progress_thread(Comm& world, ProgressThreadSetting setting, int cores) {
  auto* mpi = dynamic_cast<MpiComm*>(&world);
  const bool possible = world.size() > 1 && mpi && mpi_thread_multiple();
  std::string error;
  if (setting == ProgressThreadSetting::on && !possible)
    error = world.size() == 1 ? "parallel.progress_thread: on, but the job has one rank: "
                                "nothing travels between ranks; use auto or off"
                              : "parallel.progress_thread: on, but this MPI library did not "
                                "grant MPI_THREAD_MULTIPLE; use auto or off";
  agree_on_failure(world, error, ExitCode::bad_input);
  const bool start = possible && (setting == ProgressThreadSetting::on ||
                                  (setting == ProgressThreadSetting::automatic && cores >= 2));
  if (start) mpi->start_progress_thread();
  return start;
}

// Each rank takes its share of the node's cores, less the one a progress thread runs on,
// unless the user set thread counts.
void set_threads(Backend& backend, int cores, bool progress_thread) {
  if (std::getenv("OMP_NUM_THREADS")) return;
  backend.set_num_threads(std::max(1, cores - (progress_thread ? 1 : 0)));
}

// NCCL or staging is decided from every node's view: ranks that share a GPU anywhere make
// every rank stage, since all ranks must build the same kind of communicator.
DeviceCommChoice agree_device_comm(Comm& world, DeviceComm setting, bool point_to_point) {
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
    choice = choose_device_comm(setting, nccl_compiled(), world.size(), int(counts[0]),
                                int(counts[1]), point_to_point);
  } catch (const std::invalid_argument& problem) {
    error = problem.what();
  }
  agree_on_failure(world, error, ExitCode::bad_input);
  return choice;
}

// kernels.attention: auto is resolved once for the job, from the oldest cuDNN any rank
// loads, so that every rank runs the same attention; one log line says which and why, and
// for native on cuda another which kernels (tensor cores or FMA) the head dim runs.
void resolve_attention(Comm& world, Config& config) {
  double negated_version = -double(cudnn_loaded_version());
  const int head_dim = int(config.model.d_model / config.model.n_heads);
  world.all_reduce_host(&negated_version, 1, ReduceOp::max);
  const AttentionChoice choice =
      choose_attention(config.kernels.attention, config.device, head_dim, int64_t(-negated_version),
                       attention_has_documents(config));
  if (config.kernels.attention == AttentionKernel::automatic && world.rank() == 0)
    spdlog::info("attention: {} ({})", name_of(choice.kernel), choice.reason);
  if (config.device == BackendKind::cuda && choice.kernel == AttentionKernel::native &&
      world.rank() == 0)
    spdlog::info("attention: native kernels on {}", native_attention_kernels(head_dim));
  config.kernels.attention = choice.kernel;
}

}  // namespace

int64_t memory_limit_bytes(const Config& config) {
  return int64_t(config.memory.limit_gib * 1024.0 * 1024.0 * 1024.0);
}

JobSession open_job(const std::string& config_path, const std::vector<std::string>& overrides,
                    const std::string& command, Comm& world, bool with_backend) {
  JobSession job;
  job.watchdog = std::make_shared<Watchdog>(ParallelConfig().timeout_s, world.rank());
  job.watchdog->set_reporter([](const std::string& message) {
    spdlog::error("{}", message);
    spdlog::default_logger()->flush();
  });
  world.set_watchdog(job.watchdog);

  std::string config_error;
  std::vector<std::string> warnings;
  try {
    job.config = load_config(config_path, overrides, &warnings);
    validate_for_world(job.config, world.size());
  } catch (const ConfigError& error) {
    config_error = error.what();
  }
  agree_on_failure(world, config_error, ExitCode::bad_input);
  if (world.rank() == 0)
    for (const std::string& warning : warnings) spdlog::warn("{}", warning);
  check_same_job(world, job_identity(job.config, command));
  job.watchdog->set_timeout(job.config.parallel.timeout_s);
  resolve_attention(world, job.config);
  if (!with_backend) return job;

  std::string device_error;
  try {
    job.backend = make_backend(job.config.device, memory_limit_bytes(job.config),
                               job.config.kernels.attention);
  } catch (const DeviceUnavailableError& error) {
    device_error = error.what();
  }
  agree_on_failure(world, device_error, ExitCode::bad_input);
  return job;
}

void connect_job(JobSession& job, Comm& world) {
  // Before any split: communicators split from world share its progress thread.
  const int cores = cores_per_rank(world);
  job.progress_thread = start_progress_thread(world, job.config.parallel.progress_thread, cores);

  // MPI carries host buffers; device buffers travel over NCCL or are staged through the host.
  Comm* compute_world = &world;
  if (job.config.device == Device::cuda) {
    const DeviceCommChoice choice =
        agree_device_comm(world, job.config.parallel.device_comm, job.config.parallel.ring > 1);
    job.device_world = make_device_world(world, *job.backend, choice);
    compute_world = job.device_world.get();
    if (world.rank() == 0)
      spdlog::info("device buffers between ranks: {} ({})", choice.nccl ? "NCCL" : "MPI staged",
                   choice.reason);
  }
  job.mesh = make_mesh(*compute_world, job.config.parallel.sp, job.config.parallel.ring);
  set_threads(*job.backend, cores, job.progress_thread);
}

}  // namespace ulysses
