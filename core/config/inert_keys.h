// Keys a config gives that the rest of it leaves without effect (docs/configuration.md, "Keys
// without effect"): `train.checkpoint.every` with no checkpoint folder, the synthetic task's
// keys under `data.source: text`, `train.min_lr` with a constant rate. Each is a warning that
// names the key, where it was given, and the key that makes it inert, so a run never
// silently differs from what its config seems to say. Warnings, not errors: one config often
// serves several variants through --set (`--set data.source=text` on a passkey config).
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/config/config_reader.h"

namespace ulysses {

// One message per inert key, in the key table's order. A key given at its default value is
// not reported: a resolved config (--dry-run's YAML) gives every key.
std::vector<std::string> inert_key_warnings(const ConfigReader& reader, const Config& config);

}  // namespace ulysses
