// The transformer language model, or one pipeline chunk of it: [embedding] → layers → [final norm,
// output layer, fused cross-entropy], with explicit forward and backward (no autograd).
//
// Training: forward() runs through the loss (on the chunk that has the head) and leaves
// d(loss)/d(logits) in the record (the cross-entropy gradient overwrites the single logits
// buffer); backward() runs the layers in reverse and ADDS every weight gradient into the store's
// fp32 main grads. Per micro-batch the objective is  grad_scale * sum_t loss_weights[t] * CE_t ;
// the trainer sets grad_scale to 1 / (loss tokens of the global batch) so gradients are
// normalised globally.
//
// Pipeline parallelism: a chunk without the embedding takes its input hidden states from the
// previous stage and one without the head returns its output hidden states for the next stage
// (backward: the output gradient comes in, the input gradient goes out). With tied embeddings
// and the head on another rank than the embedding, the head chunk holds its own copy of
// `embedding.word_embeddings.weight` (same global name and initial values); the two copies'
// gradients are summed over the embedding group, so they stay identical.
//
// Tensor parallelism: the word embedding and the output layer are split over the padded
// vocabulary (parallel/tensor_parallel/vocab_parallel.h); the cross-entropy is computed from the
// logit shards without gathering logits. Every TP rank ends with the same per-token losses.
//
// Activation recomputation (TransformerConfig::recompute_*): recomputed layers keep only their
// input in forward and re-run forward inside backward; dropout masks are keyed by coordinates, so
// the re-run is identical. The re-run is announced to the hooks as part of the unit's backward
// (parallel/param_hooks.h), so under FSDP one gather serves the recomputation and the backward.
#pragma once
#include <vector>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/model_runtime.h"
#include "megadlm/model/norm_layer.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/model/transformer_layer.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

/// Which part of the model a chunk holds (the whole model by default).
struct ModelChunkSpec {
  bool embedding = true;  ///< word (and position) embedding: the first virtual stage
  bool head = true;       ///< final norm, output layer and loss: the last virtual stage
  int first_layer = 0;
  int num_layers = -1;    ///< -1: every layer from first_layer on
};

struct ModelRecord {
  std::vector<LayerRecord> layers;
  std::vector<Tensor> unit_inputs;  ///< recomputed units: the input each unit re-runs from
  NormRecord final_norm;
  Tensor final_out;  ///< input of the output layer [T, H] (all rows, also under SP)
  Tensor dlogits;    ///< [T, V/tp]: the gradient left by the fused cross-entropy (TP > 1)
  Tensor dfinal;     ///< [T, H]: d loss / d final_out, left by the fused head (no TP)
  Tensor logits;     ///< [T, V]: kept by an evaluation forward (grad_scale 0) without TP
  Tensor losses;     ///< f32 [T]: unweighted per-token CE
};

class GptModel {
 public:
  /// Registers this rank's slices of the chunk's parameters; `mp`: the model-parallel groups
  /// (kept for the model's lifetime).
  GptModel(const TransformerConfig& config, ParameterStore& store,
           const ModelParallel& mp = ModelParallel::single(), ModelChunkSpec chunk = {});

  const TransformerConfig& config() const { return cfg_; }
  const ModelChunkSpec& chunk() const { return chunk_; }
  const ModelParallel& model_parallel() const { return mp_; }

  /// Forward of this chunk. `input`: the previous stage's hidden states [rows, H] (ignored when
  /// the chunk has the embedding). With the head, adds sum_t loss_weights[t] * CE_t into
  /// `loss_sum` (f32 [1]), keeps the cross-entropy gradient when `grad_scale` > 0, and returns
  /// an undefined tensor; otherwise returns the hidden states for the next stage.
  Tensor forward(const MicroBatch& mb, const Tensor& input, ModelRecord& rec, Tensor& loss_sum,
                 float grad_scale, const ModelRuntime& rt) const;
  /// Backward of this chunk from `output_grad` (ignored with the head: the loss gradient is in
  /// the record); returns the gradient of the input hidden states (undefined with the embedding).
  Tensor backward(const MicroBatch& mb, const Tensor& output_grad, ModelRecord& rec,
                  const ModelRuntime& rt) const;

  /// The whole model (embedding and head on this chunk): forward through the loss / backward.
  void forward(const MicroBatch& mb, ModelRecord& rec, Tensor& loss_sum, float grad_scale,
               const ModelRuntime& rt) const {
    forward(mb, Tensor(), rec, loss_sum, grad_scale, rt);
  }
  void backward(const MicroBatch& mb, ModelRecord& rec, const ModelRuntime& rt) const {
    backward(mb, Tensor(), rec, rt);
  }

  /// Inference (whole model on this chunk, TP 1): the logits [rows.numel(), vocab] of the flat
  /// token indices `rows` (i32, on the model's device) of `mb`, for the first `vocab` rows of the
  /// output layer (0: the padded vocabulary). No loss, no record: each layer's activations are
  /// dropped as soon as the next layer has its input. Used by the samplers and likelihood
  /// estimators (diffusion/sampler.h); with rt.kv_cache through the key/value cache.
  Tensor logits_at(const MicroBatch& mb, const Tensor& rows, const ModelRuntime& rt, int64_t vocab = 0) const;

  /// logits_at in two parts: inference_head(inference_trunk(mb, rt, rows defined and nonempty),
  /// mb, rows, rt, vocab) is logits_at(mb, rows, rt, vocab), bit for bit. The trunk reads every
  /// token and its work depends only on mb's shape (and rt.kv_cache's call), not on the rows
  /// asked for: block decoding captures it in a CUDA graph and replays it
  /// (model/exact_cache_graphs.h). With `split_last` (a dense last layer, see
  /// splits_last_layer) the trunk stops after the last layer's attention, whose projection and
  /// MLP the head runs on the asked rows alone, as logits_at does.
  struct Trunk {
    Tensor residual;  ///< [T, H]: the residual stream (split_last: the last layer's input)
    Tensor branch;    ///< [T, H] or undefined: an MoE/TP last layer's MLP output, not yet added
    Tensor context;   ///< split_last: the last layer's attention context [T, heads * head_dim]
  };
  Trunk inference_trunk(const MicroBatch& mb, const ModelRuntime& rt, bool split_last) const;
  Tensor inference_head(Trunk trunk, const MicroBatch& mb, const Tensor& rows, const ModelRuntime& rt,
                        int64_t vocab = 0) const;
  /// Whether the last layer splits at its attention (a dense MLP on one tensor-parallel rank).
  bool splits_last_layer() const { return !layers_.empty() && layers_.back().splits_inference(); }
  /// Whether any layer is an MoE layer (their token dispatch reads counts on the host).
  bool has_moe() const;

  /// Rows of the hidden states exchanged between stages for a micro-batch of `tokens` tokens.
  int64_t hidden_rows(int64_t tokens) const;

  /// The parameter handles each block of this chunk registered, in forward order: the embedding
  /// (if any), every layer, the head (if any; without the tied weight it borrows from the
  /// embedding on the same chunk). FSDP's units.
  std::vector<std::vector<int>> param_units() const;

 private:
  Tensor embed(const MicroBatch& mb, const ModelRuntime& rt) const;
  void embed_backward(const MicroBatch& mb, Tensor dx, const ModelRuntime& rt) const;
  void head_forward(const MicroBatch& mb, const Tensor& x, ModelRecord& rec, Tensor& loss_sum,
                    float grad_scale, const ModelRuntime& rt) const;
  Tensor head_backward(const MicroBatch& mb, ModelRecord& rec, const ModelRuntime& rt) const;
  /// Layers [first, first + count) of this chunk as recomputation units.
  std::vector<std::pair<int, int>> units() const;
  bool recomputed(size_t unit) const;

  TransformerConfig cfg_;
  ParameterStore& store_;
  ModelParallel mp_;
  ModelChunkSpec chunk_;
  int64_t vocab_start_ = 0;             // first vocabulary row of this rank's shard
  ParameterStore::Handle word_embeddings_ = -1, position_embeddings_ = -1, output_layer_ = -1;
  std::vector<TransformerLayer> layers_;
  NormLayer final_norm_;
  std::vector<int> embedding_handles_;  // word (and position) embeddings
  std::vector<int> head_handles_;       // final norm and the output layer (or its tied copy)
  std::vector<int> head_reads_;         // what the head reads: head_handles_ + a borrowed tied weight
};

}  // namespace megadlm
