#include "apps/weight_source_options.h"

#include "apps/common_options.h"

namespace ulysses {

void add_weight_source_options(CLI::App& app, WeightSource& source) {
  CLI::Option* checkpoint =
      app.add_option("--checkpoint", source.checkpoint,
                     "a checkpoint step folder (step_XXXXXXXX), or a checkpoint dir whose "
                     "newest intact checkpoint is used (default, without --init-from: the "
                     "config's train.checkpoint.dir)")
          ->check(existing_folder());
  app.add_option("--init-from", source.init_from,
                 "pretrained weights as model.init_from takes them: a Hugging Face Llama folder, "
                 "an llm.c GPT-2 .bin file or a ulysses checkpoint (docs/checkpoints.md)")
      ->check(existing_file_or_folder())
      ->excludes(checkpoint);
}

}  // namespace ulysses
