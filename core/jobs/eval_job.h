// `ulysses-train eval`: the loss, perplexity, token count and (synthetic data) answer
// accuracy of a checkpoint or pretrained weights on the validation split (data.val_path,
// or the held-out tail of data.path), under the same dp×sp mesh and sharding as training,
// so it reports what the trainer's evaluation at that step reported (docs/evaluation.md).
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint/weights_source.h"
#include "core/train/evaluate.h"
#include "parallel/comm.h"

namespace ulysses {

struct EvalOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // "a.b=value"
  WeightSource weights;
  bool json = false;  // one JSON line on stdout instead of a log line
};

// Collective: opens the job, loads the weights, evaluates train.eval_steps batches and has
// rank 0 print the result. Errors as run_job's (core/jobs/job_errors.h).
EvalResult run_eval(const EvalOptions& options, Comm& world);

}  // namespace ulysses
