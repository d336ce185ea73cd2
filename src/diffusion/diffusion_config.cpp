// Names of DiffusionConfig's enums, as their flags spell them.
#include "megadlm/diffusion/diffusion_config.h"

namespace megadlm {

const char* running_mode_name(RunningMode m) {
  switch (m) {
    case RunningMode::DiffLMNoShift: return "difflm-noshift";
    case RunningMode::Vanilla: return "vanilla";
  }
  return "?";
}

const char* dlm_loss_weight_name(DlmLossWeight w) {
  switch (w) {
    case DlmLossWeight::ExactRatio: return "exact_ratio";
    case DlmLossWeight::InvT: return "inv_t";
    case DlmLossWeight::InvTEps: return "inv_t_eps";
  }
  return "?";
}

const char* block_time_granularity_name(BlockTimeGranularity g) {
  switch (g) {
    case BlockTimeGranularity::Block: return "block";
    case BlockTimeGranularity::Sequence: return "sequence";
  }
  return "?";
}

}  // namespace megadlm
