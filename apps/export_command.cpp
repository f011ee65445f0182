#include "apps/export_command.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>

#include "apps/common_options.h"
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
  app.add_option(
         "--checkpoint", options.checkpoint,
         "a checkpoint step folder (step_XXXXXXXX), or a checkpoint dir (train.checkpoint.dir)"
         " whose newest intact checkpoint is exported")
      ->required()
      ->check(existing_folder());
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
