// `ulysses-train export --checkpoint DIR --format hf-llama|llmc --out PATH`
#pragma once

namespace ulysses {

// argv[0] is the program, argv[1] is "export". Returns the process exit status.
int run_export_command(int argc, char** argv);

}  // namespace ulysses
