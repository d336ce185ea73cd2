// How the model runs (not what it is): the stream, activation dtype, dropout seed, whether it is
// training, and the data-parallel hooks to notify. The groups a layer talks over are not here:
// layers receive them once, at construction (parallel/model_parallel.h).
#pragma once
#include <cstdint>
#include "megadlm/core/dtype.h"
#include "megadlm/core/stream.h"
#include "megadlm/parallel/param_hooks.h"

namespace megadlm {

class MoeStepState;  // model/moe.h
struct KvCache;      // model/kv_cache.h

struct ModelRuntime {
  Stream stream;
  DType dtype = DType::F32;  ///< activations and model weights: f32 on CPU, bf16 on CUDA
  uint64_t seed = 1234;
  bool training = true;      ///< dropout only while training
  /// No backward follows this forward (inference, GptModel::logits_at): a layer may overwrite
  /// what it would otherwise keep for its backward (the QKV projection under the fused
  /// QK-norm + RoPE).
  bool forward_only = false;
  ParamHooks* hooks = nullptr;  ///< data-parallel wrapper to notify (none: single process)
  /// MoE state (expert biases, the aux-loss weight, the step's statistics); null: no MoE
  /// layer, or a bare model (aux losses then weigh 1 per micro-batch, nothing is recorded).
  MoeStepState* moe = nullptr;
  /// Off for the forward re-run of recomputed layers: their statistics are already counted.
  bool record_moe_stats = true;
  /// Inference with Fast-dLLM's key/value cache (model/kv_cache.h): the attention layers read
  /// and write it (SelfAttention::context_cached); null: the plain forward.
  KvCache* kv_cache = nullptr;

  /// Dtype of statistics, losses and loss weights: f32, or f64 when the whole model runs in f64
  /// (CPU gradient checks).
  DType stat_dtype() const { return dtype == DType::F64 ? DType::F64 : DType::F32; }
};

}  // namespace megadlm
