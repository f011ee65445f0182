// ulysses-train: parses the command line, builds the run from the config and turns any
// error into a logged message and a job-wide exit (DESIGN.md §6).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "apps/export_command.h"
#include "core/checkpoint.h"
#include "core/config.h"
#include "core/metrics.h"
#include "core/params.h"
#include "core/stop_signal.h"
#include "core/trainer.h"
#include "data/dataset.h"
#include "kernels/backend.h"
#include "parallel/device_comm.h"
#include "parallel/mesh.h"
#include "parallel/mpi_comm.h"

namespace ulysses {
namespace {

struct Options {
  std::string config_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  std::string resume;
};

int64_t memory_limit_bytes(const Config& config) {
  return int64_t(config.memory.limit_gib * 1024.0 * 1024.0 * 1024.0);
}

// Each rank takes its share of the node's cores unless the user set thread counts.
void set_threads(Backend& backend, Comm& world) {
  int ranks_here = ranks_on_this_node(world);
  if (std::getenv("OMP_NUM_THREADS")) return;
  int cores = int(std::thread::hardware_concurrency());
  backend.set_num_threads(std::max(1, cores / std::max(1, ranks_here)));
}

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

// Checks that need no communication end with one all-reduce of the verdict, so that every
// rank learns it before anyone exits and rank 0's message (else a failing rank's) is
// printed before mpirun tears the job down. Every rank calls this exactly once per check,
// whatever its own verdict. Returns true when the job must end with status 2.
bool agree_on_failure(Comm& world, const std::string& error) {
  double verdict[2] = {error.empty() ? 0.0 : 1.0, world.rank() == 0 && !error.empty() ? 1.0 : 0.0};
  world.all_reduce_host(verdict, 2, ReduceOp::max);
  if (verdict[0] == 0.0) return false;
  bool rank0_failed = verdict[1] > 0.0;
  if (!error.empty() && (world.rank() == 0 || !rank0_failed)) {
    spdlog::error("{}", error);
    spdlog::default_logger()->flush();
  }
  return true;
}

int run(const Options& options, Comm& world) {
  Config config;
  std::string config_error;
  try {
    config = load_config(options.config_path, options.overrides);
    validate_for_world(config, world.size());
  } catch (const ConfigError& error) {
    config_error = error.what();
  }
  if (agree_on_failure(world, config_error)) return 2;

  std::unique_ptr<Backend> backend;
  std::string device_error;
  try {
    backend = make_backend(config.device, memory_limit_bytes(config), config.kernels.attention);
  } catch (const DeviceUnavailableError& error) {
    device_error = error.what();
  }
  if (agree_on_failure(world, device_error)) return 2;
  if (options.dry_run) {
    Mesh mesh = make_mesh(world, config.parallel.sp);
    print_plan(config, *backend, mesh);
    return 0;
  }

  // MPI carries host buffers; device buffers travel over NCCL or are staged through the host.
  Comm* compute_world = &world;
  std::unique_ptr<Comm> device_world;
  if (config.device == "cuda") {
    DeviceCommChoice choice;
    std::string comm_error;
    try {
      choice = choose_device_comm(config.parallel.device_comm, nccl_compiled(), world.size(),
                                  ranks_on_this_node(world), cuda_devices_visible());
    } catch (const std::invalid_argument& error) {
      comm_error = error.what();
    }
    if (agree_on_failure(world, comm_error)) return 2;
    device_world = make_device_world(world, *backend, choice);
    compute_world = device_world.get();
    if (world.rank() == 0)
      spdlog::info("device buffers between ranks: {} ({})", choice.nccl ? "NCCL" : "MPI staged",
                   choice.reason);
  }
  Mesh mesh = make_mesh(*compute_world, config.parallel.sp);
  set_threads(*backend, world);
  if (world.rank() == 0)
    spdlog::info("ulysses-train: {} model, world {} = dp {} x sp {}, ZeRO stage {}, device {}",
                 config.model.family, world.size(), mesh.dp_size, mesh.sp_size,
                 world.size() > 1 ? config.parallel.zero_stage : 0, backend->name());
  std::string resume_folder;
  if (!options.resume.empty()) {
    if (options.resume == "auto" && config.train.checkpoint.dir.empty())
      throw std::runtime_error("--resume auto needs train.checkpoint.dir in the config");
    resume_folder = resolve_resume_path(options.resume, config.train.checkpoint.dir);
    if (resume_folder.empty() && world.rank() == 0)
      spdlog::info("--resume auto: no checkpoint in {} yet, starting from step 0",
                   config.train.checkpoint.dir);
  }
  Trainer trainer(config, *backend, mesh);
  if (resume_folder.empty()) {
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
  return 0;
}

}  // namespace
}  // namespace ulysses

int main(int argc, char** argv) {
  using namespace ulysses;
  if (argc >= 2 && std::string(argv[1]) == "export") return run_export_command(argc, argv);
  Options options;
  CLI::App app{
      "ulysses-train: trains a Llama- or GPT-2-style transformer on long sequences, each "
      "sequence split over the ranks of a sequence-parallel group (Ulysses all-to-all).\n"
      "Launch one process per rank, e.g.  mpirun -np 4 ulysses-train --config "
      "configs/passkey-sp4.yaml"};
  app.footer(
      "Exit status: 0 done (also after SIGTERM/SIGINT, with a checkpoint), 1 runtime error, 2 "
      "bad arguments or config.\nAlso: ulysses-train export --checkpoint DIR --format "
      "hf-llama|llmc --out PATH   (see ulysses-train export --help)\nDocs: docs/configuration.md, "
      "docs/checkpoints.md, docs/parallelism.md");
  app.add_option("--config,-c", options.config_path, "YAML config file (see docs/configuration.md)")
      ->required();
  app.add_option("--set", options.overrides,
                 "override a config key, e.g. --set train.lr=1e-3 (repeatable)");
  app.add_flag("--dry-run", options.dry_run,
               "validate the config, print it resolved with the parameter count and the planned "
               "tracked memory per category, and exit");
  app.add_option("--resume", options.resume,
                 "continue from a checkpoint: 'auto' (the newest intact one under "
                 "train.checkpoint.dir, or a fresh start if there is none), a step folder, or a "
                 "checkpoint dir");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }

  MpiSession mpi(&argc, &argv);
  install_stop_handlers();  // after MPI_Init, which may install handlers of its own
  std::unique_ptr<Comm> world = mpi.world();
  spdlog::set_pattern(world->size() > 1
                          ? "[%H:%M:%S] [rank " + std::to_string(world->rank()) + "] %^%l%$ %v"
                          : "[%H:%M:%S] %^%l%$ %v");
  try {
    return run(options, *world);
  } catch (const std::exception& error) {
    spdlog::error("{}", error.what());
    if (world->size() > 1) world->abort(1);
    return 1;
  }
}
