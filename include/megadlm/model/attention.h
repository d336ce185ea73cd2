// Self-attention of one transformer layer, explicit forward and backward:
//
//   x ─ QKV (column-parallel) ─ [q/k norm] ─ [RoPE] ─ core attention ─ proj (row-parallel) ─ y
//
// The input is the output of the layer's first norm (this rank's rows under sequence
// parallelism); the output is reduced over TP back to the same rows. The layer norm, the
// residual and the hidden dropout around it are the transformer layer's.
// Tensor parallelism: each TP rank holds num_heads/tp query heads and num_query_groups/tp KV
// groups (docs/parallelism/tensor_parallel.md). The core — softmax(q kᵀ / √d) v over the
// sequence, with its log-sum-exp — is the part context parallelism replaces: with CP this rank
// holds only its chunks of the sequence, RoPE rotates them by their global positions, and the
// layer's cp::ContextParallelAttention (parallel/context_parallel/attention.h, of the layer's
// --cp-comm-type) computes the attention over the whole sequence with the other CP ranks.
// Parameters (global names):
//   decoder.layers.{i}.self_attention.linear_{q,k,v}.{weight,bias}
//   decoder.layers.{i}.self_attention.{q,k}_layernorm.{weight,bias}
//   decoder.layers.{i}.self_attention.linear_proj.{weight,bias}
#pragma once
#include <string>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/model_runtime.h"
#include "megadlm/model/norm_layer.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/ops/attention.h"
#include "megadlm/parallel/context_parallel/attention.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/parallel/tensor_parallel/layers.h"

namespace megadlm {

class SelfAttention {
 public:
  /// What backward needs from forward (one per in-flight micro-batch).
  struct Saved {
    Tensor x_full;  ///< the QKV input, all rows (gathered under SP)
    NormRecord q_norm, k_norm;
    Tensor q, k, v;       ///< after norm and RoPE: [rows, heads·d], [rows, groups·d] (no CP)
    Tensor out, lse;      ///< core attention output [rows, heads·d] and its log-sum-exp (no CP)
    cp::AttentionSaved cp;  ///< with CP: what the context-parallel core keeps instead
  };

  SelfAttention() = default;
  /// Registers this rank's slices of the parameters of layer `layer_number` (global, 0-based);
  /// `prefix` is "decoder.layers.{i}.".
  SelfAttention(const TransformerConfig& config, int layer_number, const std::string& prefix,
                ParameterStore& store, const ModelParallel& mp);

  /// x [local rows, H] -> y [local rows, H] (reduced over TP); fills `saved`.
  Tensor forward(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;
  /// dy [local rows, H] -> dx [local rows, H]; adds the weight gradients; clears `saved`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;

 private:
  ops::AttentionArgs core_args(const MicroBatch& mb, const ModelRuntime& rt) const;

  const TransformerConfig* cfg_ = nullptr;
  ModelParallel mp_;
  int layer_ = 0;
  int64_t heads_ = 0, groups_ = 0;  // this rank's query heads and KV groups
  tp::ColumnParallelLinear qkv_;
  NormLayer q_norm_, k_norm_;
  tp::RowParallelLinear proj_;
  cp::ContextParallelAttention cp_attention_;  // used when mp_.cp.size > 1
};

}  // namespace megadlm
