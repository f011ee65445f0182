// The `data:` section of the config; lives here so data/ does not depend on core/.
#pragma once

#include <string>
#include <vector>

namespace ulysses {

// The YAML spellings of each enum in its order (name_of), as core/config/config.h keeps them.
enum class DataSource { synthetic, text, tokens };
inline const std::vector<std::string> kDataSourceNames = {"synthetic", "text", "tokens"};
inline const std::string& name_of(DataSource value) {
  return kDataSourceNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(DataSource) {
  return kDataSourceNames;
}

enum class DataOrder { shuffled, sequential };
inline const std::vector<std::string> kDataOrderNames = {"shuffled", "sequential"};
inline const std::string& name_of(DataOrder value) {
  return kDataOrderNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(DataOrder) {
  return kDataOrderNames;
}

// data.documents: sequences are one text, or packed documents cut at the end-of-text token
// (docs/parallelism.md, "Packed documents").
enum class DataDocuments { none, eos };
inline const std::vector<std::string> kDataDocumentsNames = {"none", "eos"};
inline const std::string& name_of(DataDocuments value) {
  return kDataDocumentsNames[size_t(value)];
}
inline const std::vector<std::string>& names_of(DataDocuments) {
  return kDataDocumentsNames;
}

// data.eos_id -1: the source's own end-of-text token (text: 256; tokens: GPT-2's 50256).
constexpr int kGpt2EndOfText = 50256;

struct DataConfig {
  DataSource source = DataSource::synthetic;
  std::string path;            // text: file, folder or glob; tokens: shard glob
  std::string val_path;        // optional separate validation files
  double val_fraction = 0.05;  // held-out tail when no val_path is given
  // text and tokens: each epoch in a seeded shuffled order, or sequences 0, 1, 2, ... as
  // llm.c's loader reads them with shuffling off (docs/configuration.md#data).
  DataOrder order = DataOrder::shuffled;
  // eos: documents end at eos_id (text also after a blank line); attention and positions
  // restart at each, and no document's last token is scored against the next one's first.
  DataDocuments documents = DataDocuments::none;
  int eos_id = -1;                 // -1: the source's (text 256, tokens 50256)
  int documents_per_sequence = 4;  // synthetic with documents eos: passkey documents per sequence
  // synthetic packed: every document after the first asks the previous one's questions, a
  // probe of leakage across documents (docs/parallelism.md, "Packed documents").
  bool ask_previous_document = false;
  // synthetic passkey / associative recall
  int n_pairs = 4;               // key-value pairs planted per sequence
  int n_queries = 4;             // pairs asked for at the end
  int n_keys = 32;               // distinct key symbols
  int n_values = 32;             // distinct value symbols
  int n_filler = 16;             // distinct filler symbols
  double plant_fraction = 0.75;  // pairs are planted in the first fraction of the sequence
};

}  // namespace ulysses
