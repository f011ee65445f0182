#include "core/jobs/export_job.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <vector>

#include "core/checkpoint/checkpoint_format.h"
#include "core/checkpoint/checkpoint_weights.h"
#include "core/checkpoint/file_util.h"
#include "core/checkpoint/weights_io_formats.h"
#include "core/model/params.h"

namespace ulysses {

namespace {

// A checkpoint step folder is the trainer's: an export there would replace its files (the
// HF format's model.safetensors is the checkpoint's name) and break its manifest's checksums.
std::string checkpoint_folder_problem(const ExportOptions& options) {
  const std::filesystem::path out(options.out);
  const std::filesystem::path folder =
      options.format == "llmc" ? (out.has_parent_path() ? out.parent_path() : ".") : out;
  std::error_code error;
  for (const char* file : {kCheckpointManifestFile, kCheckpointStateFile})
    if (std::filesystem::exists(folder / file, error))
      return "--out: '" + options.out + "' is " +
             (options.format == "llmc" ? "in a checkpoint folder ('" + folder.string() + "'"
                                       : "a checkpoint folder (it") +
             " holds " + file +
             "): an export there would replace the checkpoint's files and break "
             "it; choose a folder of its own";
  return "";
}

}  // namespace

std::string export_out_problem(const ExportOptions& options) {
  const std::string in_checkpoint = checkpoint_folder_problem(options);
  if (!in_checkpoint.empty()) return in_checkpoint;
  if (options.format == "llmc") {
    const std::string problem = output_file_problem(options.out);
    return problem.empty() ? "" : "--out: " + problem + " (--format llmc writes one .bin file)";
  }
  std::error_code error;
  if (std::filesystem::exists(options.out, error) &&
      !std::filesystem::is_directory(options.out, error))
    return "--out: '" + options.out +
           "' exists and is not a folder (--format hf-llama writes a folder)";
  return "";
}

void export_checkpoint(const ExportOptions& options) {
  const std::string folder = require_checkpoint_in(options.checkpoint, options.checkpoint_source);
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

}  // namespace ulysses
