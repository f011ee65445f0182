// `ulysses-train export`: a ulysses checkpoint's weights written in another format
// (docs/checkpoints.md, "Exporting").
#pragma once

#include <string>

namespace ulysses {

struct ExportOptions {
  std::string checkpoint;  // a step folder, or a checkpoint dir (its newest intact checkpoint)
  std::string format;      // hf-llama | llmc
  std::string out;         // hf-llama: a folder; llmc: a .bin file
  // Where checkpoint came from, for messages: the option, or the config key and its file.
  std::string checkpoint_source = "--checkpoint";
};

// Why --out cannot take the export (a folder where llmc's file goes, a file where hf-llama's
// folder goes, a parent folder that cannot be created), or "": checked before the checkpoint is
// read.
std::string export_out_problem(const ExportOptions& options);

// Verifies the checkpoint, then writes its weights. Errors name the file and the problem
// (CheckpointError for the checkpoint, WeightsError for a model the format cannot hold).
void export_checkpoint(const ExportOptions& options);

}  // namespace ulysses
