// Architecture of the transformer language model, resolved from Megatron's flags
// (docs/flags.md, "model"): every derived value (ffn size, kv channels, padded vocab) is
// already filled in, so model code never re-derives defaults.
#pragma once
#include <cstdint>
#include <string>
#include "megadlm/model/moe_config.h"
#include "megadlm/ops/attention.h"

namespace megadlm {

enum class PositionEmbeddingType { LearnedAbsolute, Rope, None };
enum class NormType { LayerNorm, RMSNorm };
enum class MlpActivation { Gelu, SwiGLU };
/// BlockCausal: block diffusion (--attention-mask-type block_causal): the model runs on the
/// doubled row [x_t | x_0] with ops::AttentionMask::BlockDiffusion, or BlockDiffusionCausal when
/// block_diffusion_causal_clean is set; the micro-batch carries the block ranges.
enum class AttentionMaskType { NoMask, Causal, BlockCausal };
/// Activation recomputation (--recompute-granularity / --recompute-method): Full drops a layer's
/// activations in forward and re-runs the layer inside backward; Selective re-runs the
/// submodules of --recompute-modules (core_attn: nothing, the fused attention kernels never store
/// their intermediates; layernorm: TransformerConfig::recompute_norms).
enum class RecomputeGranularity { None, Full, Selective };
enum class RecomputeMethod { Uniform, Block };

struct TransformerConfig {
  int num_layers = 0;
  int hidden_size = 0;
  int ffn_hidden_size = 0;          ///< resolved: 4H, or floor(4H*2/3 / 64)*64 with --swiglu
  int num_attention_heads = 0;
  int num_query_groups = 0;         ///< resolved: = heads unless --group-query-attention
  int kv_channels = 0;              ///< head dim; resolved: H / heads
  int seq_length = 0;               ///< tokens per sample seen by the model (S)
  int max_position_embeddings = 0;
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::LearnedAbsolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  NormType normalization = NormType::LayerNorm;
  float norm_epsilon = 1e-5f;
  MlpActivation activation = MlpActivation::Gelu;
  bool qk_layernorm = false;
  bool add_bias_linear = true;      ///< false with --disable-bias-linear
  bool add_qkv_bias = true;         ///< resolved: true whenever add_bias_linear
  bool untie_embeddings_and_output_weights = false;
  int64_t vocab_size = 0;           ///< the tokenizer's vocabulary (before padding)
  int64_t padded_vocab_size = 0;    ///< rounded up to --make-vocab-size-divisible-by * tp
  float init_method_std = 0.02f;
  float attention_dropout = 0.1f;
  float hidden_dropout = 0.1f;
  AttentionMaskType attention_mask = AttentionMaskType::NoMask;
  /// Block diffusion only: clean tokens attend causally (the variant trained with an AR loss on
  /// the clean half, --dlm-bd-clean-attention causal) instead of block-causally.
  bool block_diffusion_causal_clean = false;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::None;
  /// Uniform: layers are grouped into units of recompute_num_layers, each unit keeps only its
  /// input; Block: the first recompute_num_layers layers of each pipeline chunk are recomputed.
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  int recompute_num_layers = 1;
  /// --recompute-modules layernorm (selective): each layer's two norm outputs (the QKV and fc1
  /// inputs) are recomputed in backward from the saved norm inputs instead of kept: 2 T H
  /// activations less per layer for two norm passes more.
  bool recompute_norms = false;
  /// Mixture of experts: the MLP of the layers moe.moe_layers selects (model/moe.h).
  MoeConfig moe;
  /// Runtime choices (not architecture; not saved in checkpoints): the CUDA attention
  /// implementation (--attention-backend) and --deterministic-mode (bitwise reproducible
  /// backward passes).
  ops::AttentionBackend attention_backend = ops::AttentionBackend::Auto;
  bool deterministic_mode = false;

  int rotary_dim() const {
    return static_cast<int>(static_cast<float>(kv_channels) * rotary_percent) / 2 * 2;
  }
  int query_projection_size() const { return kv_channels * num_attention_heads; }
  int kv_projection_size() const { return kv_channels * num_query_groups; }
};

const char* position_embedding_type_name(PositionEmbeddingType t);
const char* norm_type_name(NormType t);
const char* attention_mask_type_name(AttentionMaskType t);

}  // namespace megadlm
