// `ulysses-train sample --config C (--checkpoint DIR | --init-from PATH) [--prompt TEXT |
// --prompt-tokens 1,2,3] [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]`
#pragma once

namespace ulysses {

// argv[0] is the program, argv[1] is "sample". Returns the process exit status.
int run_sample_command(int argc, char** argv);

}  // namespace ulysses
