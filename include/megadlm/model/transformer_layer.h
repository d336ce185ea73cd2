// One pre-norm transformer layer (Megatron's GPT layer) with explicit forward and backward,
// composed of its two blocks (model/attention.h, model/mlp.h), each tensor-parallel by
// construction (a TP group of size 1 is the plain layer):
//
//   x ─ norm1 ─ SelfAttention ─ dropout ─ + ─ x2
//   x2 ─ norm2 ─ Mlp ─ dropout ─ + ─ out
//
// In the layers --moe-layer-freq selects, a mixture of experts (model/moe.h) takes the MLP's
// place with the same shapes.
//
// Without sequence parallelism the residual stream x is replicated on every TP rank; with it,
// each rank holds a contiguous shard of the rows (tensor_parallel/mappings.h) and the blocks
// gather rows in / reduce-scatter rows out (tensor_parallel/layers.h).
//
// forward() saves what backward() needs into a LayerRecord (one per in-flight micro-batch);
// backward() consumes it, ADDS weight gradients into the store's fp32 main grads and returns the
// input gradient. Parameters: decoder.layers.{i}.input_layernorm.{weight,bias},
// decoder.layers.{i}.pre_mlp_layernorm.{weight,bias}, and those of the two blocks.
#pragma once
#include <string>
#include <variant>
#include <vector>
#include "megadlm/model/attention.h"
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/mlp.h"
#include "megadlm/model/moe.h"
#include "megadlm/model/model_runtime.h"
#include "megadlm/model/norm_layer.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

struct LayerRecord {
  Tensor x_in;
  NormRecord norm1, norm2;
  SelfAttention::Saved attention;
  Tensor x_mid;  ///< the residual stream after the attention block
  Mlp::Saved mlp;
  MoeLayer::Saved moe;  ///< MoE layers: the mixture of experts in place of the MLP
};

class TransformerLayer {
 public:
  /// Registers this rank's slices of the layer's parameters; `layer_number` is global, 0-based.
  TransformerLayer(const TransformerConfig& config, int layer_number, ParameterStore& store,
                   const ModelParallel& mp = ModelParallel::single());

  /// x [rows, H] (rows: the micro-batch's tokens, or this rank's shard of them under sequence
  /// parallelism) -> same shape; fills `rec`.
  Tensor forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec,
                 const ModelRuntime& rt) const;
  /// The forward with no backward after it (inference; rt.forward_only): the layer's input is
  /// `residual` + `branch`, the previous layer's MLP output (undefined: none), added in the first
  /// norm's pass instead of by a separate add. A dense layer on one tensor-parallel rank adds
  /// both of its branches into the residual stream inside their output projections' GEMMs
  /// (beta = 1; `residual` is updated in place) and returns an undefined branch; otherwise
  /// (MoE, TP) it returns its MLP output and leaves its residual stream in `residual`, so the
  /// caller adds the last branch. Equal to forward() up to the rounding of those sums (once, in
  /// the GEMM, instead of after the product). `keep_rows` (flat token indices, defined: the
  /// last layer under GptModel::logits_at): attention still reads every token, but what follows
  /// it runs on these rows alone, and the results hold only them, in that order (the same
  /// values: everything after attention is per row). Not for MoE layers, whose capacity drops
  /// depend on all the tokens.
  Tensor forward_inference(Tensor& residual, const Tensor& branch, const MicroBatch& mb,
                           const ModelRuntime& rt, const Tensor& keep_rows = Tensor()) const;
  /// forward_inference of a dense layer on one tensor-parallel rank, in two parts (the first
  /// reads every token, so its work depends only on the micro-batch's shape: the part of the
  /// last layer that block decoding's CUDA graphs capture, model/exact_cache_graphs.h).
  /// attention_inference: `residual` becomes the layer's input (`branch` added by the first
  /// norm's pass) and the attention context [T, heads * head_dim] is returned;
  /// finish_inference: the output projection and the MLP, added into `residual`, on `keep_rows`
  /// alone when defined (then `residual` holds those rows). Together: forward_inference, bit
  /// for bit (the same ops on the same shapes).
  Tensor attention_inference(Tensor& residual, const Tensor& branch, const MicroBatch& mb,
                             const ModelRuntime& rt) const;
  void finish_inference(Tensor& residual, Tensor context, const MicroBatch& mb, const ModelRuntime& rt,
                        const Tensor& keep_rows = Tensor()) const;
  /// Whether attention_inference / finish_inference apply (a dense MLP, one tensor-parallel rank).
  bool splits_inference() const;
  /// dy -> dx (shapes as forward's output/input); consumes (clears) `rec`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, LayerRecord& rec,
                  const ModelRuntime& rt) const;

  /// Handles of every parameter of this layer.
  const std::vector<int>& param_handles() const { return handles_; }
  /// Whether the MLP is a mixture of experts.
  bool is_moe() const { return std::holds_alternative<MoeLayer>(ffn_); }

 private:
  /// ffn_'s forward: norm2's output -> the branch it adds to the residual stream; fills
  /// rec.mlp or rec.moe.
  Tensor ffn_forward(const Tensor& x, const MicroBatch& mb, LayerRecord& rec, const ModelRuntime& rt) const;

  const TransformerConfig& cfg_;
  int layer_;
  ModelParallel mp_;
  NormLayer norm1_, norm2_;
  SelfAttention attention_;
  /// The block after the second norm: the dense MLP, or the mixture of experts of the layers
  /// --moe-layer-freq selects.
  std::variant<Mlp, MoeLayer> ffn_;
  std::vector<int> handles_;
};

}  // namespace megadlm
