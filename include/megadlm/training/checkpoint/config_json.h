// The RunConfig as JSON inside a checkpoint (docs/checkpoints.md): the record of how the
// checkpoint was trained, the source of --use-checkpoint-args, and what a loading run is
// compared with, so that a wrong architecture or vocabulary fails with the field's flag name
// instead of a shape error deep inside the model.
#pragma once
#include <string>
#include <vector>
#include "megadlm/training/training_config.h"

namespace megadlm::checkpoint {

/// Pretty-printed JSON of every field of `config` (enums by their flag spelling).
std::string run_config_to_json(const RunConfig& config);
/// The inverse; fields absent from the JSON keep their defaults (older checkpoints). Throws
/// naming `where` when the text is not a run configuration.
RunConfig run_config_from_json(const std::string& json, const std::string& where);

/// One way the model in a checkpoint differs from the model of this run.
struct ConfigMismatch {
  std::string field;   ///< the flag users know it by ("--hidden-size")
  std::string saved;   ///< value in the checkpoint
  std::string current; ///< value of this run
  bool fatal = true;   ///< false: loading proceeds with a warning
};

/// Compares architecture, vocabulary and sequence length (fatal: the weights cannot be this
/// model's, or resuming would silently change the data) and the diffusion settings (warnings).
/// With `finetune`, --seq-length and --rotary-base may change (fine-tuning to another context
/// length is legitimate); --max-position-embeddings matters only for learned position embeddings.
std::vector<ConfigMismatch> compare_run_configs(const RunConfig& saved, const RunConfig& current,
                                                bool finetune);

}  // namespace megadlm::checkpoint
