#include "apps/sample_command.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <limits>
#include <sstream>

#include "apps/common_options.h"
#include "apps/weight_source_options.h"
#include "core/jobs/run_on_world.h"
#include "core/jobs/sample_job.h"
#include "data/input_file.h"
#include "parallel/exit_code.h"

namespace ulysses {

namespace {

// The bytes of path ('-': standard input) into text; "" when read, else what is wrong, naming
// the file.
std::string read_prompt_file(const std::string& path, std::string& text) {
  if (path == "-") {
    std::ostringstream bytes;
    bytes << std::cin.rdbuf();
    text = bytes.str();
  } else {
    InputFile file(path);
    if (!file.is_open() || !file.read_all(text)) return file.problem();
  }
  if (text.empty()) return "'" + path + "' is empty: there is no prompt to continue";
  return "";
}

}  // namespace

int run_sample_command(int argc, char** argv) {
  SampleOptions options;
  CLI::App app{
      "ulysses-train sample: the continuation a checkpoint or pretrained model writes for a "
      "prompt (decoded as text for byte-level models), or, for the synthetic task without a "
      "prompt, its answer to each query of validation sequences next to the true value. Runs "
      "on one rank and recomputes the whole forward for every new token (no KV cache). See "
      "docs/evaluation.md.",
      "ulysses-train sample"};
  app.footer("Exit status: 0 sampled, 1 a runtime failure, 2 bad arguments, config or weights.");
  app.add_option("--config,-c", options.config_path,
                 "the model's YAML config (see docs/configuration.md)")
      ->required();
  app.add_option("--set", options.overrides, "override a config key (repeatable)");
  add_weight_source_options(app, options.weights);
  // An empty --prompt would silently mean no prompt: the synthetic task's queries.
  CLI::Option* prompt =
      app.add_option("--prompt", options.prompt,
                     "text to continue, one token per byte (data.source: text)")
          ->check(CLI::Validator(
              [](std::string& text) {
                return text.empty() ? std::string("is empty: there is no prompt to continue")
                                    : std::string();
              },
              "TEXT", "non-empty"));
  std::string prompt_file;
  CLI::Option* prompt_from_file =
      app.add_option("--prompt-file", prompt_file,
                     "as --prompt, the text of a file ('-': standard input): for a long context, "
                     "which a command line cannot hold (128 KiB an argument on Linux)")
          ->excludes(prompt);
  app.add_option("--prompt-tokens", options.prompt_tokens, "token ids to continue, e.g. 1,2,3")
      ->delimiter(',')
      ->excludes(prompt)
      ->excludes(prompt_from_file);
  constexpr double kLargestInt = std::numeric_limits<int>::max();
  app.add_option("--max-new-tokens", options.max_new_tokens, "tokens to generate (default 64)")
      ->check(number_between(1, kLargestInt));
  app.add_option("--temperature", options.sampling.temperature,
                 "softmax temperature; 0 is greedy (default 1)")
      ->check(number_at_least(0));
  app.add_option("--top-k", options.sampling.top_k,
                 "draw among the k most likely tokens only; 0 means all (default 0)")
      ->check(number_between(0, kLargestInt));
  app.add_option("--seed", options.sampling.seed, "seed of the draws (default 0)")
      ->check(unsigned_64_bit());
  app.add_option("--sequences", options.sequences,
                 "synthetic task without a prompt: validation sequences to answer (default 1)")
      ->check(number_between(1, kLargestInt));
  app.add_flag("--json", options.json,
               "print one JSON line on stdout: {weights, prompt_tokens, new_tokens, text} or, "
               "for the synthetic queries, {weights, queries, accuracy}");
  std::string color = "auto";
  add_color_option(app, color);
  try {
    app.parse(argc - 1, argv + 1);  // argv[1] is "sample"
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(ExitCode::bad_input);
  }
  if (!prompt_file.empty()) {
    if (const std::string problem = read_prompt_file(prompt_file, options.prompt);
        !problem.empty()) {
      std::cerr << "ulysses-train sample: --prompt-file " << problem << "\n";
      return int(ExitCode::bad_input);
    }
  }
  // stdout is the samples (text, tokens or JSON); the log goes apart.
  return run_on_world(&argc, &argv, false, parse_log_color(color), LogStream::err,
                      [&](Comm& world) { run_sample(options, world); });
}

}  // namespace ulysses
