// The `data:` section of the config; lives here so data/ does not depend on core/.
#pragma once

#include <string>

namespace ulysses {

struct DataConfig {
  std::string source = "synthetic";  // synthetic | text | tokens
  std::string path;                  // text: file, folder or glob; tokens: shard glob
  std::string val_path;              // optional separate validation files
  double val_fraction = 0.05;        // held-out tail when no val_path is given
  // text and tokens: each epoch in a seeded shuffled order, or sequences 0, 1, 2, ... as
  // llm.c's loader reads them with shuffling off (docs/configuration.md#data).
  std::string order = "shuffled";  // shuffled | sequential
  // synthetic passkey / associative recall
  int n_pairs = 4;               // key-value pairs planted per sequence
  int n_queries = 4;             // pairs asked for at the end
  int n_keys = 32;               // distinct key symbols
  int n_values = 32;             // distinct value symbols
  int n_filler = 16;             // distinct filler symbols
  double plant_fraction = 0.75;  // pairs are planted in the first fraction of the sequence
};

}  // namespace ulysses
