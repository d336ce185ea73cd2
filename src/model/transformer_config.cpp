// Names of TransformerConfig's enums, as their flags spell them.
#include "megadlm/model/transformer_config.h"

namespace megadlm {

const char* position_embedding_type_name(PositionEmbeddingType t) {
  switch (t) {
    case PositionEmbeddingType::LearnedAbsolute: return "learned_absolute";
    case PositionEmbeddingType::Rope: return "rope";
    case PositionEmbeddingType::None: return "none";
  }
  return "?";
}

const char* norm_type_name(NormType t) {
  switch (t) {
    case NormType::LayerNorm: return "LayerNorm";
    case NormType::RMSNorm: return "RMSNorm";
  }
  return "?";
}

const char* attention_mask_type_name(AttentionMaskType t) {
  switch (t) {
    case AttentionMaskType::NoMask: return "no_mask";
    case AttentionMaskType::Causal: return "causal";
    case AttentionMaskType::BlockCausal: return "block_causal";
  }
  return "?";
}

}  // namespace megadlm
