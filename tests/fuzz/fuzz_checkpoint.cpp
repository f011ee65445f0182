// libFuzzer target: the checkpoint manifest and trainer_state readers
// (core/checkpoint/checkpoint_format.h). The input is one JSON file, given to parse_manifest and to
// parse_trainer_state. What either accepts must write back (manifest_json,
// trainer_state_json) to text it reads again to the same values. Only CheckpointError is an
// expected outcome.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/checkpoint/checkpoint_format.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace ulysses;

bool same_manifest(const CheckpointManifest& a, const CheckpointManifest& b) {
  if (a.step != b.step || a.files.size() != b.files.size()) return false;
  for (size_t i = 0; i < a.files.size(); i++) {
    if (a.files[i].name != b.files[i].name || a.files[i].bytes != b.files[i].bytes ||
        a.files[i].crc32 != b.files[i].crc32)
      return false;
  }
  return true;
}

bool same_model(const CheckpointModel& a, const CheckpointModel& b) {
  const ModelConfig &x = a.model, &y = b.model;
  return x.family == y.family && x.n_layers == y.n_layers && x.d_model == y.d_model &&
         x.n_heads == y.n_heads && x.n_kv_heads == y.n_kv_heads && x.d_ff == y.d_ff &&
         x.vocab_size == y.vocab_size && x.max_seq_len == y.max_seq_len &&
         a.rope_theta == b.rope_theta && a.norm_eps == b.norm_eps;
}

bool same_state(const TrainerState& a, const TrainerState& b) {
  return a.step == b.step && a.sequences_per_step == b.sequences_per_step && a.loss == b.loss &&
         a.world_size == b.world_size && a.sp == b.sp && a.zero_stage == b.zero_stage &&
         same_model(a.model, b.model) && a.optimizer_shards == b.optimizer_shards;
}

void fuzz_manifest(const std::string& text) {
  CheckpointManifest manifest;
  try {
    manifest = parse_manifest(text, "manifest.json");
  } catch (const CheckpointError&) {
    return;
  }
  const std::string written = manifest_json(manifest);
  try {
    if (!same_manifest(parse_manifest(written, "written manifest.json"), manifest))
      fuzz::invariant_failed("manifest_json does not read back to the same manifest", written);
  } catch (const CheckpointError& error) {
    fuzz::invariant_failed("parse_manifest refuses the output of manifest_json",
                           written + error.what());
  }
}

void fuzz_trainer_state(const std::string& text) {
  TrainerState state;
  try {
    state = parse_trainer_state(text, "trainer_state.json");
  } catch (const CheckpointError&) {
    return;
  }
  // Not recorded (0) is only ever read from old checkpoints, never written; an infinite
  // loss is written as null (absent) on purpose.
  if (state.sequences_per_step == 0 || (state.loss && !std::isfinite(*state.loss))) return;
  const std::string written = trainer_state_json(state);
  try {
    if (!same_state(parse_trainer_state(written, "written trainer_state.json"), state))
      fuzz::invariant_failed("trainer_state_json does not read back to the same state", written);
  } catch (const CheckpointError& error) {
    fuzz::invariant_failed("parse_trainer_state refuses the output of trainer_state_json",
                           written + error.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz_manifest(text);
  fuzz_trainer_state(text);
  return 0;
}
