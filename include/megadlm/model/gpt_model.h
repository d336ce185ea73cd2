// The transformer language model: embedding, layers, final norm, output layer and the fused
// cross-entropy, with explicit forward and backward (no autograd).
//
// Training: forward() runs through the loss and leaves d(loss)/d(logits) in the record (the
// cross-entropy gradient overwrites the single logits buffer); backward() then runs the layers in
// reverse and ADDS every weight gradient into the store's fp32 main grads. Per micro-batch the
// objective is  grad_scale * sum_t loss_weights[t] * CE_t ; the trainer sets grad_scale to
// 1 / (loss tokens of the global batch) so gradients are normalised globally.
//
// Tensor parallelism: the word embedding and the output layer are split over the padded
// vocabulary (vocab-parallel); the cross-entropy is computed from the logit shards with three
// small all-reduces (row max, sum of exponentials, target logit) instead of gathering logits.
// Every TP rank ends with the same per-token losses.
#pragma once
#include <vector>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/norm_layer.h"
#include "megadlm/model/parameter_store.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/model/transformer_layer.h"

namespace megadlm {

struct ModelRecord {
  std::vector<LayerRecord> layers;
  NormRecord final_norm;
  Tensor final_out;  ///< input of the output layer [T, H] (all rows, also under SP)
  Tensor dlogits;    ///< [T, V]: the gradient left by the fused cross-entropy
  Tensor losses;     ///< f32 [T]: unweighted per-token CE
};

class GptModel {
 public:
  GptModel(const TransformerConfig& config, ParameterStore& store, TensorParallelLayout tp = {});

  const TransformerConfig& config() const { return cfg_; }

  /// Forward through the loss. Adds sum_t loss_weights[t] * CE_t into `loss_sum` (f32 [1]).
  /// With `grad_scale` > 0 the cross-entropy gradient is kept for backward() (training).
  void forward(const MicroBatch& mb, ModelRecord& rec, Tensor& loss_sum, float grad_scale,
               const ModelRuntime& rt) const;
  /// Backward from the gradient left by forward(); consumes the record.
  void backward(const MicroBatch& mb, ModelRecord& rec, const ModelRuntime& rt) const;

 private:
  TransformerConfig cfg_;
  ParameterStore& store_;
  ParameterStore::Handle word_embeddings_ = -1, position_embeddings_ = -1, output_layer_ = -1;
  std::vector<TransformerLayer> layers_;
  NormLayer final_norm_;
  TensorParallelLayout tp_;
  int64_t vocab_start_ = 0;             // first vocabulary row of this rank's shard
  std::vector<int> embedding_handles_;  // word (and position) embeddings
  std::vector<int> head_handles_;       // final norm and the untied output layer
};

}  // namespace megadlm
