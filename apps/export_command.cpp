#include "apps/export_command.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/world_main.h"
#include "core/checkpoint_format.h"
#include "core/checkpoint_weights.h"
#include "core/job_errors.h"
#include "core/log_setup.h"
#include "core/params.h"
#include "core/weights_io_formats.h"

namespace ulysses {

namespace {

struct ExportOptions {
  std::string checkpoint;
  std::string format;
  std::string out;
};

void export_checkpoint(const ExportOptions& options) {
  std::string folder = options.checkpoint;
  if (!std::filesystem::exists(folder + "/manifest.json")) {
    folder = find_latest_checkpoint(options.checkpoint);
    if (folder.empty())
      throw CheckpointError("--checkpoint: " + why_no_checkpoint_in(options.checkpoint));
  }
  verify_checkpoint(folder);
  const CheckpointModel recorded = read_checkpoint_model(folder);
  const ParamTable table(recorded.model);
  // The export formats are whole files written by this one process.
  std::vector<float> params(size_t(table.total_numel()));
  CheckpointWeights(folder, table).read(0, table.total_numel(), params.data());

  if (options.format == "hf-llama") {
    if (!recorded.rope_theta || !recorded.norm_eps)
      spdlog::warn(
          "{} does not record rope_theta or norm_eps; config.json gets rope_theta {} and "
          "rms_norm_eps {} (the trainer's defaults)",
          folder, recorded.model.rope_theta, recorded.model.norm_eps);
    write_hf_llama(options.out, recorded.model, table, params);
  } else {
    write_llmc(options.out, recorded.model, table, params);
  }
  spdlog::info("exported {} ({} model, {} parameters) as {} to {}", folder,
               name_of(recorded.model.family), table.total_numel(), options.format, options.out);
}

}  // namespace

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
      ->check(CLI::ExistingDirectory);
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
    return app.exit(error) == 0 ? 0 : 2;
  }

  setup_logging(parse_log_color(color));
  try {
    export_checkpoint(options);
  } catch (const std::exception& error) {
    spdlog::error("export: {}", error.what());
    return int(exit_code_for(error));
  }
  return 0;
}

}  // namespace ulysses
