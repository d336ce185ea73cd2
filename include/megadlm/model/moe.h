// The mixture-of-experts block that replaces the MLP of the layers --moe-layer-freq selects
// (Megatron-Core's MoELayer), explicit forward and backward with the Mlp's shape:
//
//   x ─ router (logits in fp32) ─ top-k | sinkhorn | expert choice ─ [capacity] ─┐
//   x ──────────── dispatch (parallel/expert_parallel) ── experts ── combine ─────┴─ y
//   x ─ shared experts (a dense TP MLP, optional) ──────────────────────────────── + y
//
// Rows are this rank's tokens (its SP shard when TP > 1, padding rows excluded: SP's at the
// end of the last shard, CP's — sequences padded to split into 2·cp chunks — wherever the
// padded positions fall in this rank's chunks; those are compacted out before routing). Experts are
// split over EP (rank e holds experts [e·E/ep, (e+1)·E/ep)) and each over expert TP (fc1
// column-, fc2 row-parallel). The router's auxiliary losses — load balancing (aux_loss,
// seq_aux_loss, expert choice) and z-loss — join the objective with weight
// MoeStepState::aux_grad_scale per micro-batch (1 / micro-batches of the global batch: their
// mean over the global batch, as Megatron's loss-scale / num_microbatches with the DP average),
// and are normalised by the tokens of the whole micro-batch, so every layout trains the same
// function (docs/parallelism/expert_parallel.md lists where this differs from Megatron).
// Routing that looks across rows (expert choice, capacity dropping) is decided on the whole
// micro-batch: under SP the logits are gathered over TP first.
//
// Parameters (global names; experts by their global index, so checkpoints are EP-independent):
//   decoder.layers.{i}.mlp.router.weight                                   [E, H] (dense)
//   decoder.layers.{i}.mlp.experts.{e}.linear_fc1_{gate,up}.{weight,bias}  (SwiGLU) | linear_fc1.*
//   decoder.layers.{i}.mlp.experts.{e}.linear_fc2.{weight,bias}
//   decoder.layers.{i}.mlp.shared_experts.linear_fc1_{gate,up}|linear_fc1, linear_fc2  (dense)
// The local experts' fc1 weights are one fused [E_local · (2·)F/etp, H] matrix and their fc2
// weights one [E_local · H, F/etp] matrix, so the grouped GEMM reads them in place.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "megadlm/model/micro_batch.h"
#include "megadlm/model/mlp.h"
#include "megadlm/model/model_runtime.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/ops/moe.h"
#include "megadlm/parallel/expert_parallel/token_dispatcher.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

/// MoE state of a run outside the parameters: what the trainer sets, what the layers report.
class MoeStepState {
 public:
  /// Columns of a layer's statistics row: [E counts routed (before dropping) | E counts kept |
  /// aux | z], this rank's share summed over the step's micro-batches. "aux" is the
  /// load-balancing loss without its coefficient, "z" the z-loss without its coefficient, each
  /// summed over micro-batches (so the sum over ranks divided by the micro-batches of the
  /// global batch is their mean).
  static int stat_columns(int num_experts) { return 2 * num_experts + 2; }

  /// `stat_dtype`: the runtime's (f32; f64 in CPU gradient checks).
  MoeStepState(const TransformerConfig& config, DType stat_dtype, const Stream& stream);

  /// Zeroes the statistics (start of a step).
  void begin_step(const Stream& stream);

  int num_experts = 0;
  Tensor stats;  ///< [num_layers, stat_columns] (stat dtype): one row per global layer
  /// Per global layer: f32 [E] expert bias (--moe-router-enable-expert-bias) or undefined.
  std::vector<Tensor> expert_bias;
  /// Weight of each micro-batch's aux and z losses in the objective.
  float aux_grad_scale = 1.0f;
};

/// The router: logits = x W_r^T in fp32 and the routing decision.
class MoeRouter {
 public:
  MoeRouter() = default;
  MoeRouter(const TransformerConfig& config, int layer, const std::string& prefix,
            ParameterStore& store, const ModelParallel& mp);
  ParameterStore::Handle weight() const { return weight_; }

 private:
  friend class MoeLayer;
  ParameterStore* store_ = nullptr;
  ParameterStore::Handle weight_ = -1;
};

/// The local experts: per expert x ─ fc1 ─ SwiGLU | GELU ─ fc2, as grouped GEMMs over the
/// expert-major rows (or, without --moe-grouped-gemm, one GEMM per expert: the same function).
class MoeExperts {
 public:
  struct Saved {
    Tensor x;                   ///< [N, H] expert input rows
    Tensor fc1_out, act_out;    ///< [N, (2·)F/etp], [N, F/etp]
    std::vector<int64_t> rows;  ///< rows per local expert
    /// FP8: [local expert][source] rows (TokenDispatcher::Saved::source_rows; the caller sets
    /// it before forward) and the scales each source's rows of the fc1 / fc2 inputs were
    /// quantized with (f32 [sources]), reused by the weight-gradient GEMMs.
    std::vector<int64_t> source_rows;
    Tensor fc1_scales, fc2_scales;
  };
  MoeExperts() = default;
  MoeExperts(const TransformerConfig& config, const std::string& prefix, int first_expert,
             int local_experts, ParameterStore& store, const ModelParallel& mp);
  /// x [N, H] -> y [N, H], partial sums over expert TP (fc2's bias added on expert-TP rank 0).
  Tensor forward(const Tensor& x, const std::vector<int64_t>& rows, Saved& saved,
                 const Stream& stream) const;
  /// dy [N, H] (complete) -> dx [N, H] (partial over expert TP); adds the weight gradients.
  Tensor backward(const Tensor& dy, Saved& saved, const Stream& stream) const;

 private:
  /// y = x W^T + b per expert (W: G stacked blocks of `span`).
  void gemm_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y,
                    const std::vector<int64_t>& rows, const Stream& stream) const;
  /// dx = dy W per expert (written); dW += dy^T x (and db += sum dy) per expert.
  void gemm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor* db,
                     Tensor& dx, const std::vector<int64_t>& rows, const Stream& stream) const;

  /// db += per-expert row sums of dy.
  void bias_grad(const Tensor& dy, Tensor& db, const std::vector<int64_t>& rows, const Stream& stream) const;

  // FP8 (docs/fp8.md, "MoE experts"): every GEMM of every (expert, source) chunk in FP8.
  struct Fp8Gemm {
    int input = -1, grad_output = -1;  ///< Fp8State slots of the layer's operand tensors
    std::vector<int> weight;           ///< slot of each local expert's weight
    mutable std::vector<ops::Fp8Tensor> cache;  ///< each local expert's weight cast
    mutable uint64_t generation = 0;
  };
  bool fp8() const { return fp8_ != nullptr; }
  /// The cast of every local expert's weight of the current generation (w: stacked experts).
  const std::vector<ops::Fp8Tensor>& fp8_weights(const Fp8Gemm& g, const Tensor& w, const Stream& s) const;
  /// Per-source scales (f32 [sources, 1]; delayed: the slot's [1] scale for every source) of
  /// an operand x whose rows follow source_rows: tensorwise, each source's scale comes from the
  /// amax of its micro-batch's rows over all experts and every rank holding some of them.
  /// Collective under tensorwise (every rank of the layer calls it, with or without rows).
  Tensor fp8_scales(int slot, const Tensor& x, const std::vector<int64_t>& source_rows, const Stream& s) const;
  /// x quantized with `scale`; `pad` appends zero rows up to a multiple of 16 (the K of the
  /// weight-gradient GEMM on CUDA; zero rows add nothing to it).
  ops::Fp8Tensor fp8_cast(int slot, const Tensor& x, const Tensor& scale, bool columnwise, bool pad,
                          bool record_amax, const Stream& s) const;
  void fp8_forward(const Fp8Gemm& g, const Tensor& x, const Tensor& scales, const Tensor& w,
                   const Tensor* bias, Tensor& y, const std::vector<int64_t>& source_rows,
                   const Stream& s) const;
  void fp8_backward(const Fp8Gemm& g, const Tensor& dy, const Tensor& x, const Tensor& x_scales,
                    const Tensor& w, Tensor& dw, Tensor& dx, const std::vector<int64_t>& source_rows,
                    const Stream& s) const;

  ParameterStore* store_ = nullptr;
  MlpActivation activation_ = MlpActivation::SwiGLU;
  bool grouped_ = false;
  bool fc2_bias_here_ = false;  // fc2's replicated bias is added on expert-TP rank 0 only
  int local_ = 0;
  int64_t ffn_ = 0;  // this rank's width of one expert (F / etp)
  ParameterStore::Handle w1_first_ = -1, w1_last_ = -1, w2_first_ = -1, w2_last_ = -1;
  ParameterStore::Handle b1_first_ = -1, b1_last_ = -1, b2_first_ = -1, b2_last_ = -1;
  std::shared_ptr<Fp8State> fp8_;
  Fp8Gemm fc1_, fc2_;
  // The groups the tensorwise amaxes are reduced over.
  comm::Communicator *ep_ = nullptr, *etp_ = nullptr, *tp_ = nullptr, *cp_ = nullptr;
  int sources_ = 1, self_source_ = 0;
};

class MoeLayer {
 public:
  struct Saved {
    int64_t rows = 0;       ///< routed rows (this rank's valid rows)
    /// int32 [local rows, 1]: each local row's index among the routed rows, -1 for padding,
    /// when the routed rows are not a prefix of the local rows (CP padding inside the shard);
    /// undefined otherwise.
    Tensor compact;
    Tensor x;               ///< [rows, H] router and expert input
    Tensor logits;          ///< [rows, E] (stat dtype)
    Tensor indices;         ///< [rows, K] the selection (before capacity dropping)
    Tensor aux_weights;     ///< [G, E] counts the aux loss weighs scores with (or undefined)
    ops::RouterLossArgs loss;  ///< scaled coefficients of the aux / z gradients
    Tensor ec_dlogits;      ///< expert choice: gradient of its aux loss for these rows
    ep::TokenDispatcher::Saved dispatch;
    MoeExperts::Saved experts;
    Mlp::Saved shared;
  };

  MoeLayer() = default;
  /// Registers this rank's parameters of layer `layer` (global); `prefix` is "decoder.layers.{i}.".
  MoeLayer(const TransformerConfig& config, int layer, const std::string& prefix,
           ParameterStore& store, const ModelParallel& mp);

  /// x [local rows, H] -> y [local rows, H]; fills `saved`. Training forwards add this layer's
  /// statistics to rt.moe (unless rt.record_moe_stats is off).
  Tensor forward(const Tensor& x, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;
  /// dy -> dx; adds the weight gradients (router, experts, shared experts); clears `saved`.
  Tensor backward(const Tensor& dy, const MicroBatch& mb, Saved& saved, const ModelRuntime& rt) const;

 private:
  /// The routing of this rank's rows: probs and indices [rows, K] as the dispatcher takes them
  /// (`dispatched`: capacity-dropped slots set to -1).
  void route(const MicroBatch& mb, Saved& saved, Tensor& probs, Tensor& dispatched,
             const ModelRuntime& rt) const;
  /// Statistics and the aux / z losses of the routing (training only).
  void balance(const MicroBatch& mb, Saved& saved, const Tensor& dispatched, const ModelRuntime& rt) const;
  ops::RouterTopkArgs topk_args(bool training) const;
  /// Tokens of the whole micro-batch the routing losses are normalised by (over SP shards and
  /// CP chunks, without CP padding).
  double micro_batch_tokens(const MicroBatch& mb) const;

  MoeConfig cfg_;
  int layer_ = 0;
  int64_t hidden_ = 0;
  ModelParallel mp_;
  ParameterStore* store_ = nullptr;
  MoeRouter router_;
  MoeExperts experts_;
  std::shared_ptr<const ep::TokenDispatcher> dispatcher_;
  bool shared_ = false;
  Mlp shared_mlp_;
};

}  // namespace megadlm
