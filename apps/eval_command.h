// `ulysses-train eval --config C (--checkpoint DIR | --init-from PATH) [--json]`
#pragma once

namespace ulysses {

// argv[0] is the program, argv[1] is "eval". Returns the process exit status.
int run_eval_command(int argc, char** argv);

}  // namespace ulysses
