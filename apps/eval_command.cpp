#include "apps/eval_command.h"

#include <CLI/CLI.hpp>
#include <iostream>

#include "apps/common_options.h"
#include "apps/weight_source_options.h"
#include "core/jobs/eval_job.h"
#include "core/jobs/run_on_world.h"
#include "parallel/exit_code.h"

namespace ulysses {

int run_eval_command(int argc, char** argv) {
  EvalOptions options;
  CLI::App app{
      "ulysses-train eval: the loss, perplexity, token count and (synthetic task) answer "
      "accuracy of a checkpoint or pretrained weights on the validation split (data.val_path, "
      "or the held-out tail of data.path): train.eval_steps batches, sharded over the ranks "
      "like training (launch it under mpirun as the training run). See docs/evaluation.md.",
      "ulysses-train eval"};
  app.footer(
      "Exit status: 0 evaluated, 1 a runtime failure, 2 bad arguments, config, data or "
      "weights (the same on every rank).");
  app.add_option("--config,-c", options.config_path, "YAML config file (see docs/configuration.md)")
      ->required();
  app.add_option("--set", options.overrides,
                 "override a config key, e.g. --set train.eval_steps=8 (repeatable)");
  add_weight_source_options(app, options.weights);
  app.add_flag("--json", options.json,
               "print one JSON line {weights, split, loss, perplexity, tokens, sequences, world, "
               "sp, accuracy} on stdout, the log on stderr");
  std::string color = "auto";
  add_color_option(app, color);
  try {
    app.parse(argc - 1, argv + 1);  // argv[1] is "eval"
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(ExitCode::bad_input);
  }
  return run_on_world(&argc, &argv, false, parse_log_color(color),
                      options.json ? LogStream::err : LogStream::out,
                      [&](Comm& world) { run_eval(options, world); });
}

}  // namespace ulysses
