// Self-attention of one transformer layer, explicit forward and backward:
//
//   x ─ QKV (column-parallel) ─ [q/k norm] ─ [RoPE] ─ core attention ─ proj (row-parallel) ─ y
//
// The fused path (RMSNorm QK-norm or none; CPU, or CUDA with head_dim a multiple of 32): the QKV
// rows go through ops::qk_norm_rope_forward and ops::attention_forward_packed without split or
// concat copies, and only the raw QKV rows and the norm statistics are saved: the backward
// recomputes the normalised, rotated rows (one cheap pass) instead of keeping them.
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
#include "megadlm/ops/qk_norm_rope.h"
#include "megadlm/parallel/context_parallel/attention.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/parallel/tensor_parallel/layers.h"

namespace megadlm {

class SelfAttention {
 public:
  /// What backward needs from forward (one per in-flight micro-batch).
  struct Saved {
    tp::LinearInput x_full;  ///< what the QKV weight gradient needs of its input (all rows; tp::LinearInput)
    NormRecord q_norm, k_norm;
    Tensor q, k, v;       ///< after norm and RoPE: [rows, heads·d], [rows, groups·d] (no CP)
    Tensor qkv, qk_rstd;  ///< fused path: the raw QKV rows and the q/k norm statistics
    Tensor out, lse;      ///< core attention output [rows, heads·d] and its log-sum-exp (no CP)
    cp::AttentionSaved cp;  ///< with CP: what the context-parallel core keeps instead of q, k, v, lse
  };

  SelfAttention() = default;
  /// Registers this rank's slices of the parameters of layer `layer_number` (global, 0-based);
  /// `prefix` is "decoder.layers.{i}.".
  SelfAttention(const TransformerConfig& config, int layer_number, const std::string& prefix,
                ParameterStore& store, const ModelParallel& mp);

  /// x [local rows, H] -> y [local rows, H] (reduced over TP); fills `saved`: the output
  /// projection of context().
  Tensor forward(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;
  /// The core attention's output before the output projection, [rows, heads·d] (saved.out).
  Tensor context(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;
  /// One tensor-parallel rank: out = residual + context's output projection, added by the
  /// projection's GEMM (tp::RowParallelLinear::forward_add); out may be residual (in place).
  void project_add(const Tensor& context, const Tensor& residual, Tensor& out, const Stream& s) const;
  /// Inference through rt.kv_cache (model/kv_cache.h; attention_cached.cpp): x holds the rows of
  /// the cache's current columns; context() comes here when rt.kv_cache is set.
  Tensor context_cached(const Tensor& x, const MicroBatch& mb, const ModelRuntime& rt) const;
  /// dy [local rows, H] -> dx [local rows, H]; adds the weight gradients; clears `saved`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;

 private:
  ops::AttentionArgs core_args(const MicroBatch& mb, const ModelRuntime& rt) const;
  bool fused_qk(const ModelRuntime& rt) const;
  ops::QkNormRopeArgs qk_args() const;
  /// How rotated_qkv writes its rows.
  struct RotateOptions {
    /// Written over qkv (the value heads untouched): when no backward will read qkv again.
    bool in_place = false;
    /// false: the rows' value heads stay unwritten (the attention reads qkv's).
    bool copy_values = true;
  };
  /// Fused path: the rows attention reads (q, k normalised and rotated, v as is).
  Tensor rotated_qkv(const Tensor& qkv, Tensor& rstd, const MicroBatch& mb, const Stream& s,
                     RotateOptions options) const;
  /// Training's fused path: whether the attention reads the value heads from the projection's
  /// output itself (cuDNN reads the packed rows in place; split copies would cost more).
  bool values_from_projection(const ops::AttentionArgs& a, const ModelRuntime& rt) const;
  /// Fused path under CP: the rotated rows as separate q, k, v (the CP core's inputs).
  struct SplitRows {
    Tensor q, k, v;
  };
  SplitRows split_rows(const Tensor& rows, int64_t t, const Stream& s) const;
  const cp::SequenceLayout& cp_layout(const MicroBatch& mb) const;

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
