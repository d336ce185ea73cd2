// One pre-norm transformer layer (Megatron's GPT layer) with explicit forward and backward.
//
//   x ─ norm1 ─ QKV ─ [q/k norm] ─ [RoPE] ─ attention (dropout on P) ─ proj ─ dropout ─ + ─ x2
//   x2 ─ norm2 ─ fc1 ─ SwiGLU|GELU ─ fc2 ─ dropout ─ + ─ out
//
// forward() saves what backward() needs into a LayerRecord (one per in-flight micro-batch);
// backward() consumes it, ADDS weight gradients into the store's fp32 main grads and returns the
// input gradient. Parameters (names as Megatron's where they exist; q/k/v and gate/up are
// separate tensors that the store keeps adjacent so each pair/triple is one GEMM):
//   decoder.layers.{i}.input_layernorm.{weight,bias}
//   decoder.layers.{i}.self_attention.linear_{q,k,v}.{weight,bias}
//   decoder.layers.{i}.self_attention.{q,k}_layernorm.{weight,bias}
//   decoder.layers.{i}.self_attention.linear_proj.{weight,bias}
//   decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}
//   decoder.layers.{i}.mlp.linear_fc1_{gate,up}.{weight,bias}  (SwiGLU) | mlp.linear_fc1.*
//   decoder.layers.{i}.mlp.linear_fc2.{weight,bias}
#pragma once
#include <string>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/norm_layer.h"
#include "megadlm/model/param_hooks.h"
#include "megadlm/model/parameter_store.h"
#include "megadlm/model/transformer_config.h"

namespace megadlm {

/// How the model runs (not what it is): the stream, activation dtype and the dropout seed.
struct ModelRuntime {
  Stream stream;
  DType dtype = DType::F32;  ///< activations and model weights: f32 on CPU, bf16 on CUDA
  uint64_t seed = 1234;
  bool training = true;      ///< dropout only while training
  ParamHooks* hooks = nullptr;  ///< data-parallel wrapper to notify (none: single process)

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
  /// Registers this layer's parameters; `layer_number` is the global 0-based index.
  TransformerLayer(const TransformerConfig& config, int layer_number, ParameterStore& store);

  /// x [T, H] -> [T, H]; fills `rec`.
  Tensor forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec,
                 const ModelRuntime& rt) const;
  /// dy [T, H] -> dx [T, H]; consumes (clears) `rec`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, LayerRecord& rec,
                  const ModelRuntime& rt) const;

  /// Handles of every parameter of this layer.
  const std::vector<int>& param_handles() const { return handles_; }

 private:
  struct Linear {
    ParameterStore::Handle w_first = -1, w_last = -1;  // fused span of weights
    ParameterStore::Handle b_first = -1, b_last = -1;  // fused span of biases (or -1)
  };
  Tensor linear_forward(const Linear& l, const Tensor& x, int64_t out_features,
                        const ModelRuntime& rt) const;
  /// Returns dx (undefined if !need_dx); adds dW, db.
  Tensor linear_backward(const Linear& l, const Tensor& dy, const Tensor& x,
                         const ModelRuntime& rt) const;

  const TransformerConfig& cfg_;
  ParameterStore& store_;
  int layer_;
  NormLayer norm1_, norm2_, q_norm_, k_norm_;
  Linear qkv_, proj_, fc1_, fc2_;
  std::vector<int> handles_;
};

}  // namespace megadlm
