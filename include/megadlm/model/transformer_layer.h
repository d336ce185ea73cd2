// One pre-norm transformer layer (Megatron's GPT layer) with explicit forward and backward,
// tensor-parallel by construction (a TP group of size 1 is the plain layer).
//
//   x ─ norm1 ─ QKV ─ [q/k norm] ─ [RoPE] ─ attention ─ proj ─ dropout ─ + ─ x2
//   x2 ─ norm2 ─ fc1 ─ SwiGLU|GELU ─ fc2 ─ dropout ─ + ─ out
//
// Tensor parallelism (docs/parallelism/tensor_parallel.md): QKV and fc1 are column-parallel
// (each rank holds num_heads/tp query heads, num_query_groups/tp KV groups, ffn/tp MLP
// columns; SwiGLU's gate and up stay paired), proj and fc2 are row-parallel, their bias added
// once after the reduction. Without sequence parallelism the residual stream x is replicated on
// every TP rank; with it, each rank holds a contiguous shard of the rows (tensor_parallel/
// mappings.h) and the blocks gather rows in / reduce-scatter rows out.
//
// forward() saves what backward() needs into a LayerRecord (one per in-flight micro-batch);
// backward() consumes it, ADDS weight gradients into the store's fp32 main grads and returns the
// input gradient. Parameters (global names; q/k/v and gate/up are separate tensors that the
// store keeps adjacent so each set is one GEMM):
//   decoder.layers.{i}.input_layernorm.{weight,bias}
//   decoder.layers.{i}.self_attention.linear_{q,k,v}.{weight,bias}
//   decoder.layers.{i}.self_attention.{q,k}_layernorm.{weight,bias}
//   decoder.layers.{i}.self_attention.linear_proj.{weight,bias}
//   decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}
//   decoder.layers.{i}.mlp.linear_fc1_{gate,up}.{weight,bias}  (SwiGLU) | mlp.linear_fc1.*
//   decoder.layers.{i}.mlp.linear_fc2.{weight,bias}
#pragma once
#include <string>
#include "megadlm/comm/communicator.h"
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/norm_layer.h"
#include "megadlm/model/param_hooks.h"
#include "megadlm/model/parameter_store.h"
#include "megadlm/model/transformer_config.h"

namespace megadlm {

/// This rank's place in the tensor-parallel group, fixed when the model is built.
struct TensorParallelLayout {
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;
};

/// How the model runs (not what it is): the stream, activation dtype, dropout seed and groups.
struct ModelRuntime {
  Stream stream;
  DType dtype = DType::F32;  ///< activations and model weights: f32 on CPU, bf16 on CUDA
  uint64_t seed = 1234;
  bool training = true;      ///< dropout only while training
  ParamHooks* hooks = nullptr;  ///< data-parallel wrapper to notify (none: single process)
  comm::Communicator* tp = nullptr;  ///< tensor-parallel group (null: size 1)

  /// Dtype of statistics, losses and loss weights: f32, or f64 when the whole model runs in f64
  /// (CPU gradient checks).
  DType stat_dtype() const { return dtype == DType::F64 ? DType::F64 : DType::F32; }
};

struct LayerRecord {
  Tensor x_in;
  NormRecord norm1, q_norm, k_norm, norm2;
  Tensor norm1_out, q, k, v, attn_out, lse, x_mid, norm2_out, fc1_out, act_out;
};

class TransformerLayer {
 public:
  /// Registers this rank's slices of the layer's parameters; `layer_number` is global, 0-based.
  TransformerLayer(const TransformerConfig& config, int layer_number, ParameterStore& store,
                   TensorParallelLayout tp = {});

  /// x [rows, H] (rows: the micro-batch's tokens, or this rank's shard of them under sequence
  /// parallelism) -> same shape; fills `rec`.
  Tensor forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec,
                 const ModelRuntime& rt) const;
  /// dy -> dx (shapes as forward's output/input); consumes (clears) `rec`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, LayerRecord& rec,
                  const ModelRuntime& rt) const;

  /// Handles of every parameter of this layer.
  const std::vector<int>& param_handles() const { return handles_; }

 private:
  struct Linear {
    ParameterStore::Handle w_first = -1, w_last = -1;  // fused span of weights
    ParameterStore::Handle b_first = -1, b_last = -1;  // fused span of biases (or -1)
  };
  /// y = x W^T (+ b); `with_bias` false leaves the bias out (row-parallel ranks but the first).
  Tensor linear_forward(const Linear& l, const Tensor& x, int64_t out_features, bool with_bias,
                        const ModelRuntime& rt) const;
  /// Adds dW (and db when `bias_grad`), returns dx = dy W.
  Tensor linear_backward(const Linear& l, const Tensor& dy, const Tensor& x, bool bias_grad,
                         const ModelRuntime& rt) const;
  /// Column-parallel input: the full rows (gathered under sequence parallelism).
  Tensor region_input(const Tensor& x, const MicroBatch& mb, const ModelRuntime& rt) const;
  /// Row-parallel output: partial sums reduced (all-reduce, or reduce-scatter under SP).
  Tensor region_output(const Tensor& partial, const ModelRuntime& rt) const;
  /// Backward of region_input: the partial input gradient reduced back to x's rows.
  Tensor region_input_grad(const Tensor& partial, const ModelRuntime& rt) const;
  /// Backward of region_output: the gradient of the full rows (gathered under SP).
  Tensor region_output_grad(const Tensor& dy, const MicroBatch& mb, const ModelRuntime& rt) const;

  const TransformerConfig& cfg_;
  ParameterStore& store_;
  int layer_;
  TensorParallelLayout tp_;
  int64_t heads_, groups_;  // local query heads and KV groups
  int64_t ffn_;             // local MLP width
  NormLayer norm1_, norm2_, q_norm_, k_norm_;
  Linear qkv_, proj_, fc1_, fc2_;
  std::vector<int> handles_;
};

}  // namespace megadlm
