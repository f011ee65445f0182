// ulysses-train: parses the command line, runs the job (core/jobs/run_job.h) and turns any error
// into a logged message and an exit status on every rank (docs/failures.md).
#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>

#include "apps/common_options.h"
#include "apps/eval_command.h"
#include "apps/export_command.h"
#include "apps/plan_command.h"
#include "apps/sample_command.h"
#include "core/config/config.h"
#include "core/jobs/job_identity.h"
#include "core/jobs/run_job.h"
#include "core/jobs/run_on_world.h"
#include "core/report/log_setup.h"
#include "parallel/exit_code.h"

int main(int argc, char** argv) {
  using namespace ulysses;
  // A write past the file-size limit (ulimit -f) then fails with EFBIG and is reported like any
  // I/O error (docs/failures.md#a-full-disk), instead of killing the rank mid-checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc >= 2 && std::string(argv[1]) == "export") return run_export_command(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "eval") return run_eval_command(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "sample") return run_sample_command(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "plan") return run_plan_command(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "config-reference") {
    std::cout << config_reference_markdown();
    return 0;
  }
  JobOptions options;
  std::string resume;
  std::string color = "auto";
  CLI::App app{
      "ulysses-train: trains a Llama- or GPT-2-style transformer on long sequences, each "
      "sequence split over the ranks of a sequence-parallel group (Ulysses all-to-all).\n"
      "Launch one process per rank, e.g.  mpirun -np 4 ulysses-train --config "
      "configs/passkey-sp4.yaml"};
  app.footer(
      "Exit status (the same on every rank):\n"
      "  0  finished (also after SIGTERM/SIGINT, with a checkpoint)\n"
      "  1  runtime failure (I/O, MPI, out of memory)\n"
      "  2  bad arguments, config, data, checkpoint or weight files\n"
      "  3  the loss or gradient became NaN or infinite, or the loss spiked (train.on_nonfinite;\n"
      "     the message names the checkpoint to go back to)\n"
      "  4  a rank waited longer than parallel.timeout_s in a collective (watchdog)\n"
      "Also (each with --help):\n"
      "  ulysses-train export --checkpoint DIR --format hf-llama|llmc --out PATH\n"
      "  ulysses-train eval --config C [--checkpoint DIR | --init-from PATH] [--json]\n"
      "  ulysses-train sample --config C [--checkpoint DIR | --init-from PATH] [--prompt TEXT | "
      "--prompt-file PATH | --prompt-tokens 1,2,3] [--max-new-tokens N] [--temperature T] "
      "[--top-k K] [--seed S]\n"
      "  ulysses-train config-reference   (the key tables of docs/configuration.md)\n"
      "  ulysses-train plan --config C --seq 32k,1m --sp 1,8 --device-gib 80 [--json]   (memory "
      "plan on any machine, device: cuda too)\n"
      "Docs: docs/configuration.md, docs/checkpoints.md, docs/evaluation.md, docs/memory.md, "
      "docs/failures.md, docs/parallelism.md");
  app.set_version_flag("--version", std::string("ulysses-train ") + ulysses_version(),
                       "print the version this binary was built from (git describe) and exit");
  app.add_option("--config,-c", options.config_path, "YAML config file (see docs/configuration.md)")
      ->required();
  app.add_option("--set", options.overrides,
                 "override a config key, e.g. --set train.lr=1e-3 (repeatable)");
  app.add_flag("--dry-run", options.dry_run,
               "validate the config, print it resolved with the parameter count and the planned "
               "tracked memory per category, and exit");
  CLI::Option* resume_option = app.add_option(
      "--resume", resume,
      "continue from a checkpoint: 'auto' (the newest intact one under train.checkpoint.dir, or "
      "a fresh start if there is none), a step folder, or a checkpoint dir");
  add_color_option(app, color);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(ExitCode::bad_input);
  }
  if (resume_option->count() > 0) {
    if (resume.empty()) {
      std::cerr << "--resume needs a value: auto, a step folder or a checkpoint dir\n";
      return int(ExitCode::bad_input);
    }
    options.resume = resume;
  }

  return run_on_world(&argc, &argv, true, parse_log_color(color), LogStream::out,
                      [&](Comm& world) { run_job(options, world); });
}
