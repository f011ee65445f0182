// A tiny run on the synthetic task that evaluates and checkpoints every 2 steps, shared by
// the tests of `ulysses-train eval` and `sample` (docs/evaluation.md).
#pragma once

#include <string>

#include "tests/testing.h"

namespace ulysses::testing {

// The config of a 4-step run in dir: eval and checkpoint (dir/ckpt, all kept) every 2 steps,
// metrics in dir/m.jsonl. extra is appended (e.g. a parallel: line).
inline std::string eval_run_yaml(const TempDir& dir, const std::string& extra = "") {
  return "model: {family: llama, n_layers: 1, d_model: 32, n_heads: 4, d_ff: 64}\n"
         "train: {steps: 4, batch_size: 2, seq_len: 64, seed: 3, lr: 3e-3, eval_every: 2, "
         "eval_steps: 2, checkpoint: {dir: " +
         dir.file("ckpt") +
         ", every: 2, keep_last: 0}}\n"
         "data: {source: synthetic, n_pairs: 2, n_queries: 2, n_keys: 8, n_values: 8}\n"
         "log: {metrics_file: " +
         dir.file("m.jsonl") + "}\n" + extra;
}

// The metrics line of the trainer's evaluation at step.
inline nlohmann::json trainer_eval_at(const TempDir& dir, int step) {
  for (const nlohmann::json& line : read_metrics_lines(dir.file("m.jsonl")))
    if (line.contains("eval_loss") && line["step"].get<int>() == step) return line;
  return nlohmann::json();
}

}  // namespace ulysses::testing
