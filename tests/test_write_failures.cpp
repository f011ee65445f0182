// A file that cannot be written (a full disk, a quota) leaves no partial file taking the space,
// and a file replaced durably is the old one or the whole new one: RLIMIT_FSIZE stops the write
// part way, as a full disk would (write(2) fails with EFBIG once SIGXFSZ is ignored, as
// ulysses-train does). docs/failures.md#a-full-disk.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/checkpoint/file_util.h"
#include "core/checkpoint/weights_io_formats.h"
#include "tests/testing.h"

namespace ulysses {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

ModelConfig model_of(Family family) {
  ModelConfig model;
  model.family = family;
  model.n_layers = 2;
  model.d_model = 64;
  model.n_heads = 4;
  model.n_kv_heads = 4;
  model.d_ff = 256;
  model.vocab_size = 100;
  model.max_seq_len = 16;
  return model;
}

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder))
    names.push_back(entry.path().filename().string());
  return names;
}

TEST(WriteFailure, ADurableWriteThatFailsRemovesItsPartialFile) {
  TempDir dir;
  const std::string path = dir.file("state.json");
  const std::string error = testing::error_under_file_size_limit(
      16, [&] { write_file_durably(path, std::string(100, 'x')); });
  EXPECT_MENTIONS(error, "cannot write '" + path + "': File too large");
  EXPECT_FALSE(fs::exists(path));
}

TEST(WriteFailure, AReplacementThatFailsKeepsTheOldFileAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("latest");
  replace_file_durably(path, "step_00000001\n");
  const std::string error = testing::error_under_file_size_limit(
      16, [&] { replace_file_durably(path, std::string(100, 'x')); });
  EXPECT_MENTIONS(error, path + ".tmp");
  EXPECT_EQ(testing::read_text_file(path), "step_00000001\n");
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"latest"});
  // The rename failing (a folder in the way) takes its temporary file away too.
  fs::create_directories(dir.file("in-the-way/inside"));
  EXPECT_THROW(replace_file_durably(dir.file("in-the-way"), "text"), std::runtime_error);
  EXPECT_FALSE(fs::exists(dir.file("in-the-way.tmp")));
}

TEST(ExportFailure, AHuggingFaceFolderThatCannotBeWrittenKeepsNoPartialFile) {
  TempDir dir;
  const ModelConfig model = model_of(Family::llama);
  const ParamTable table(model);
  const std::vector<float> weights(size_t(table.total_numel()), 0.5f);
  const std::string error = testing::error_under_file_size_limit(
      64 * 1024, [&] { write_hf_llama(dir.file("out"), model, table, weights); });
  EXPECT_MENTIONS(error, "model.safetensors.tmp");
  EXPECT_MENTIONS(error, "File too large");
  EXPECT_EQ(files_in(dir.file("out")), std::vector<std::string>{});
}

TEST(ExportFailure, AnLlmcFileThatCannotBeWrittenKeepsNoPartialFile) {
  TempDir dir;
  const ModelConfig model = model_of(Family::gpt2);
  const ParamTable table(model);
  const std::vector<float> weights(size_t(table.total_numel()), 0.5f);
  const std::string error = testing::error_under_file_size_limit(
      64 * 1024, [&] { write_llmc(dir.file("gpt2.bin"), model, table, weights); });
  EXPECT_MENTIONS(error, "gpt2.bin.tmp");
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{});
}

}  // namespace
}  // namespace ulysses
