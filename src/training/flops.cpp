#include "megadlm/training/flops.h"

namespace megadlm {

double megatron_flops_per_iteration(const TransformerConfig& m, int64_t global_batch_size,
                                    int64_t block_size) {
  const double b = static_cast<double>(global_batch_size), s = m.seq_length, l = m.num_layers,
               h = m.hidden_size, n = m.num_attention_heads, g = m.num_query_groups,
               f = m.ffn_hidden_size, v = static_cast<double>(m.padded_vocab_size);
  const double q_ratio = static_cast<double>(m.query_projection_size()) / h;
  const double gated = m.activation == MlpActivation::SwiGLU ? 1.5 : 1.0;
  // MoE layers count the active experts: topk experts of the expert width plus the shared
  // experts (Megatron 0.10 multiplies --ffn-hidden-size by topk instead: see docs/compat.md).
  double mlp = f;
  if (m.moe.enabled() && l > 0) {
    const double moe_layers = m.moe.num_moe_layers();
    const double moe_width = static_cast<double>(m.moe.ffn_hidden_size) * m.moe.topk + m.moe.shared_expert_size;
    mlp = ((l - moe_layers) * f + moe_layers * moe_width) / l;
  }
  if (block_size > 0) {
    const double bs = static_cast<double>(block_size);
    const double pairs = m.block_diffusion_causal_clean ? s * s + s * bs / 2.0 + s / 2.0 : s * s + s * bs;
    return 12.0 * b * l * h * h *
               (2.0 * s * ((1.0 + g / n) * q_ratio + (mlp / h) * gated) + (pairs / h) * q_ratio) +
           6.0 * b * s * h * v;
  }
  return 12.0 * b * s * l * h * h *
         ((1.0 + g / n + s / h) * q_ratio + (mlp / h) * gated + v / (2.0 * l * h));
}

}  // namespace megadlm
