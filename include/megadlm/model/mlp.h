// The feed-forward block of one transformer layer, explicit forward and backward:
//
//   x ─ fc1 (column-parallel; SwiGLU: gate and up fused) ─ SwiGLU | GELU ─ fc2 (row-parallel) ─ y
//
// The input is the output of the layer's second norm (this rank's rows under sequence
// parallelism); the output is reduced over TP back to the same rows. Each TP rank holds ffn/tp
// columns (SwiGLU's gate and up stay paired). A mixture of experts (model/moe) replaces this
// block in the layers --moe-layer-freq selects, with the same forward/backward shape.
// Parameters (global names):
//   decoder.layers.{i}.mlp.linear_fc1_{gate,up}.{weight,bias}  (SwiGLU) | mlp.linear_fc1.*
//   decoder.layers.{i}.mlp.linear_fc2.{weight,bias}
#pragma once
#include <string>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/model_runtime.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/parallel/tensor_parallel/layers.h"

namespace megadlm {

class Mlp {
 public:
  /// What backward needs from forward (one per in-flight micro-batch).
  struct Saved {
    tp::LinearInput x_full;  ///< what fc1's weight gradient needs of its input (all rows; tp::LinearInput)
    Tensor fc1_out;  ///< pre-activation [rows, (2·)ffn/tp]
    Tensor act_out;  ///< fc2's input [rows, ffn/tp]: not kept; the backward recomputes it
  };

  Mlp() = default;
  /// Registers this rank's slices; `prefix` is "decoder.layers.{i}.".
  Mlp(const TransformerConfig& config, const std::string& prefix, ParameterStore& store,
      const ModelParallel& mp);
  /// An MLP of width `ffn` whose parameters are named `block_prefix` + "linear_fc1...", e.g. the
  /// shared experts of an MoE layer ("decoder.layers.{i}.mlp.shared_experts.").
  Mlp(const TransformerConfig& config, const std::string& block_prefix, int64_t ffn,
      ParameterStore& store, const ModelParallel& mp);

  /// x [local rows, H] -> y [local rows, H] (reduced over TP); fills `saved`.
  Tensor forward(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;
  /// One tensor-parallel rank: out [rows, H] = residual + the block's output, added by fc2's
  /// GEMM (tp::RowParallelLinear::forward_add); out may be residual (inference, in place).
  void forward_add(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt,
                   const Tensor& residual, Tensor& out) const;
  /// dy [local rows, H] -> dx [local rows, H]; adds the weight gradients; clears `saved`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;

 private:
  /// act(fc1_out) [rows, ffn/tp]: the forward's output, and its recomputation in backward.
  Tensor activate(const Tensor& fc1_out, const Stream& s) const;

  MlpActivation activation_ = MlpActivation::SwiGLU;
  int64_t ffn_ = 0;  // this rank's MLP width
  tp::ColumnParallelLinear fc1_;
  tp::RowParallelLinear fc2_;
};

}  // namespace megadlm
