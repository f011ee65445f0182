// `ulysses-train sample`: the continuation a checkpoint or pretrained model writes for a
// prompt (bytes of text for byte-level models, or token ids), or, on the synthetic task,
// its answer to each query of validation sequences next to the true value
// (docs/evaluation.md). It runs on one rank: generation reruns the whole forward per token
// (core/train/sampler.h) and gains nothing from splitting such short sequences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint/weights_source.h"
#include "core/train/sampler.h"
#include "parallel/comm.h"

namespace ulysses {

struct SampleOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // "a.b=value"
  WeightSource weights;
  std::string prompt;                  // --prompt or --prompt-file: text, one token per byte
  std::vector<int32_t> prompt_tokens;  // --prompt-tokens
  int max_new_tokens = 64;
  SamplingOptions sampling;
  int sequences = 1;  // synthetic task without a prompt: validation sequences to answer
  bool json = false;  // one JSON line on stdout instead of readable text
};

// Collective (a job of one rank; more ranks are refused with exit status 2 on each).
void run_sample(const SampleOptions& options, Comm& world);

}  // namespace ulysses
