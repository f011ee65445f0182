#include "apps/export_command.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "apps/common_options.h"
#include "core/config/config.h"
#include "core/jobs/export_job.h"
#include "core/jobs/job_errors.h"
#include "core/report/log_setup.h"

namespace ulysses {

int run_export_command(int argc, char** argv) {
  ExportOptions options;
  CLI::App app{
      "ulysses-train export: writes the weights of a ulysses checkpoint in another format.\n"
      "  hf-llama  llama checkpoints: a Hugging Face LlamaForCausalLM folder (config.json and "
      "model.safetensors in F32)\n"
      "  llmc      gpt2 checkpoints: an llm.c GPT-2 checkpoint file (version 3, fp32, vocabulary "
      "padded to a multiple of 128)\n"
      "Only the weights are exported, not the optimizer state. Exit status: 0 exported, 1 a "
      "runtime failure, 2 bad arguments or a checkpoint that cannot be read or does not fit the "
      "format.",
      "ulysses-train export"};
  CLI::Option* checkpoint =
      app.add_option("--checkpoint", options.checkpoint,
                     "a checkpoint step folder (step_XXXXXXXX), or a checkpoint dir "
                     "(train.checkpoint.dir) whose newest intact checkpoint is exported")
          ->check(existing_folder());
  std::string config_path;
  app.add_option("--config,-c", config_path,
                 "instead of --checkpoint: the run's YAML config, whose train.checkpoint.dir "
                 "holds the checkpoint to export (its newest intact one)")
      ->check(CLI::ExistingFile)
      ->excludes(checkpoint);
  app.add_option("--format", options.format,
                 "hf-llama (llama checkpoints) or llmc (gpt2 checkpoints)")
      ->required()
      ->check(CLI::IsMember({"hf-llama", "llmc"}));
  app.add_option("--out", options.out,
                 "hf-llama: the folder to write config.json and model.safetensors into (created if "
                 "needed); llmc: the .bin file to write")
      ->required();
  std::string color = "auto";
  add_color_option(app, color);
  try {
    app.parse(argc - 1, argv + 1);  // argv[1] is "export"
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(ExitCode::bad_input);
  }

  setup_logging(parse_log_color(color));
  if (!config_path.empty()) {
    try {
      options.checkpoint = load_config(config_path, {}).train.checkpoint.dir;
      options.checkpoint_source = "train.checkpoint.dir of " + config_path;
    } catch (const ConfigError& error) {
      spdlog::error("export: {}", error.what());
      return int(ExitCode::bad_input);
    }
    if (options.checkpoint.empty()) {
      spdlog::error("export: {} sets no train.checkpoint.dir; give --checkpoint", config_path);
      return int(ExitCode::bad_input);
    }
  } else if (options.checkpoint.empty()) {
    spdlog::error(
        "export: give --checkpoint, or --config whose train.checkpoint.dir holds the run");
    return int(ExitCode::bad_input);
  }
  if (const std::string problem = export_out_problem(options); !problem.empty()) {
    spdlog::error("export: {}", problem);
    return int(ExitCode::bad_input);
  }
  try {
    export_checkpoint(options);
  } catch (const std::exception& error) {
    spdlog::error("export: {}", error.what());
    return int(exit_code_for(error));
  }
  return 0;
}

}  // namespace ulysses
