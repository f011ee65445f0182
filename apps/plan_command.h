// `ulysses-train plan --config C [--seq 32k,1m] [--sp 1,8] [--world W] [--device-gib G]`
#pragma once

namespace ulysses {

// argv[0] is the program, argv[1] is "plan". Returns the process exit status.
int run_plan_command(int argc, char** argv);

}  // namespace ulysses
