// Keys a config gives that the rest of it leaves without effect warn, naming the key, where it
// was given and the key that makes it inert (core/config/inert_keys.h); keys in effect, keys at
// their default and the shipped configs warn about nothing.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace ulysses {
namespace {

std::vector<std::string> warnings_of(const std::string& yaml,
                                     const std::vector<std::string>& overrides) {
  std::vector<std::string> warnings;
  parse_config(yaml, overrides, "c.yaml", &warnings);
  return warnings;
}

const std::string kSynthetic = "train:\n  steps: 3\n";
const std::string kText =
    "train:\n  steps: 3\ndata:\n  source: text\n  path: " ULYSSES_SOURCE_DIR "/docs\n";

struct InertCase {
  std::string yaml;
  std::string given;  // the override that gives the inert key
  std::string key;    // as the warning shows it
  std::string because;
};

TEST(InertKeys, EachRuleNamesTheKeyWhereItWasGivenAndWhatMakesItInert) {
  const std::vector<InertCase> cases = {
      {kText, "data.n_pairs=2", "data.n_pairs = 2", "data.source = 'text' (c.yaml:4)"},
      {kText, "data.plant_fraction=0.5", "data.plant_fraction = 0.5", "data.source = 'text'"},
      {kText, "data.documents_per_sequence=2", "data.documents_per_sequence = 2",
       "data.source = 'text'"},
      {kSynthetic, "data.path=/tmp", "data.path = '/tmp'", "data.source = 'synthetic' (default)"},
      {kSynthetic, "data.order=sequential", "data.order = 'sequential'", "data.source"},
      {kSynthetic, "data.eos_id=3", "data.eos_id = 3", "data.source"},
      {kText + "  val_path: /tmp\n", "data.val_fraction=0.2", "data.val_fraction = 0.2",
       "data.val_path = '/tmp' (c.yaml:6)"},
      {kText, "data.eos_id=10", "data.eos_id = 10", "data.documents = 'none' (default)"},
      {kSynthetic, "data.documents_per_sequence=2", "data.documents_per_sequence = 2",
       "data.documents = 'none'"},
      {"model:\n  family: gpt2\n", "model.rope_theta=20000", "model.rope_theta = 20000",
       "model.family = 'gpt2' (c.yaml:2)"},
      {"train:\n  schedule: constant\n", "train.min_lr=1e-5", "train.min_lr = 1e-05",
       "train.schedule = 'constant'"},
      {kSynthetic, "train.max_skipped_steps=3", "train.max_skipped_steps = 3",
       "train.on_nonfinite = 'abort' (default)"},
      {kSynthetic, "train.checkpoint.every=50",
       "train.checkpoint.every = 50 (override 'train.checkpoint.every=50')",
       "train.checkpoint.dir = '' (default): no checkpoint is written"},
      {kSynthetic, "train.checkpoint.keep_last=2", "train.checkpoint.keep_last = 2",
       "train.checkpoint.dir"},
      {kSynthetic, "train.checkpoint.overwrite=true", "train.checkpoint.overwrite = true",
       "train.checkpoint.dir"},
      {kSynthetic, "log.trace_steps=3", "log.trace_steps = 3", "log.trace_file = ''"},
      {kSynthetic, "log.device_timing=false", "log.device_timing = false",
       "device = 'cpu' (default)"},
      {kSynthetic, "parallel.device_comm=mpi", "parallel.device_comm = 'mpi'", "device = 'cpu'"},
  };
  for (const InertCase& inert : cases) {
    const std::vector<std::string> warnings = warnings_of(inert.yaml, {inert.given});
    ASSERT_EQ(warnings.size(), 1u) << inert.given;
    EXPECT_NE(warnings[0].find(inert.key), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find(" has no effect while " + inert.because), std::string::npos)
        << warnings[0];
  }
}

TEST(InertKeys, KeysInEffectOrAtTheirDefaultWarnAboutNothing) {
  const std::vector<std::pair<std::string, std::string>> quiet = {
      {kSynthetic, "data.n_pairs=8"},
      {kText, "data.order=sequential"},
      {kText, "data.val_fraction=0.2"},
      {kText + "  documents: eos\n", "data.eos_id=10"},
      {kSynthetic + "data:\n  documents: eos\n", "data.documents_per_sequence=2"},
      {kSynthetic, "model.rope_theta=500000"},
      {kSynthetic, "train.min_lr=1e-5"},
      {kSynthetic + "  on_nonfinite: skip\n", "train.max_skipped_steps=3"},
      {kSynthetic, "train.checkpoint.dir=/tmp/c"},
      {"train:\n  checkpoint:\n    dir: /tmp/c\n", "train.checkpoint.every=50"},
      {"log:\n  trace_file: /tmp/t.json\n", "log.trace_steps=3"},
      // given, but at the default: a resolved config (--dry-run's YAML) gives every key
      {kText, "data.n_pairs=4"},
      {kSynthetic, "train.checkpoint.every=0"},
      {kSynthetic, "log.device_timing=true"},
  };
  for (const auto& [yaml, given] : quiet)
    EXPECT_EQ(warnings_of(yaml, {given}), std::vector<std::string>{}) << given;
}

TEST(InertKeys, AKeyMadeInertByTwoRulesWarnsOnce) {
  // data.eos_id under synthetic with documents none: both the source's rule and the
  // documents' rule apply; the first in the table speaks.
  const std::vector<std::string> warnings = warnings_of(kSynthetic, {"data.eos_id=3"});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("data.source"), std::string::npos) << warnings[0];
}

TEST(InertKeys, TheShippedConfigsGiveNoInertKey) {
  int configs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ULYSSES_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    std::vector<std::string> warnings;
    load_config(entry.path().string(), {}, &warnings);
    EXPECT_EQ(warnings, std::vector<std::string>{}) << entry.path();
    ++configs;
  }
  EXPECT_GE(configs, 5);
}

}  // namespace
}  // namespace ulysses
