// The FP8 scaling state of a model on one rank: which recipe, and for every FP8-quantized
// tensor of the transformer layers' linears (input, weight, output gradient of QKV, proj, fc1,
// fc2) its amax of the running step, its delayed-scaling amax history and its scale.
// docs/fp8.md ("Training") defines the semantics; the summary:
//
//  - The logical tensor a scale belongs to is layout-independent: a linear's weight (all TP
//    pieces), and one micro-batch's activation or gradient (all its TP, SP and CP pieces). Every
//    amax is MAX-reduced over the ranks holding pieces of that tensor, so every rank quantizes
//    with the same scale as a single rank would.
//  - Tensorwise (current) scaling: the scale comes from the tensor's own amax, reduced over TP
//    (weights) or TP and CP (activations, gradients) before the cast. No state.
//  - Delayed scaling: the scale used during a step comes from the history. Every cast raises the
//    tensor's running amax; once per step (finish_step) the amaxes are MAX-reduced over TP and
//    the gradient group (data x context parallel), so micro-batch and data-parallel splits give
//    the amax of the whole global batch, and ops::fp8_delayed_update turns the history on every
//    rank alike. The histories and scales are training state (checkpointed by name).
//  - Blockwise scaling (DeepSeek-V3): one scale per 1x128 tile of an activation or gradient
//    and per 128x128 block of a weight, each from the tile's own amax at the cast. No state, no
//    communication: a tile's scale depends only on its 128 (or 128x128) elements, so the run is
//    layout-independent as long as every shard boundary falls on a multiple of 128 (validation
//    enforces it; docs/fp8.md "Blockwise scaling").
//  - Weights are cast once per step (per optimizer update) and reused by every micro-batch:
//    `generation()` changes at every begin_step, and a linear re-casts when it changed.
// Shared by every linear of a rank (all its pipeline chunks) through ModelParallel::fp8.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/fp8.h"
#include "megadlm/ops/fp8_gemm.h"

namespace megadlm {

enum class Fp8Scaling { Delayed, Tensorwise, Blockwise };

struct Fp8Settings {
  Fp8Scaling scaling = Fp8Scaling::Delayed;
  ops::Fp8Type fwd_type = ops::Fp8Type::E4M3;   ///< inputs and weights
  ops::Fp8Type grad_type = ops::Fp8Type::E5M2;  ///< output gradients (e4m3 under --fp8-format e4m3)
  int margin = 0;                               ///< delayed: scale / 2^margin
  int history_len = 1;                          ///< delayed: amax history length
  ops::AmaxComputeAlgo algo = ops::AmaxComputeAlgo::MostRecent;
  /// blockwise: tile scales rounded down to powers of two (Transformer Engine's default for
  /// this recipe; dequantization is then exact in fp32).
  bool block_power_of_2 = true;
  bool wgrad = true;  ///< false: weight-gradient GEMMs in high precision (--no-fp8-wgrad)
  /// Global layers [0, bf16_start) and [num_layers - bf16_end, num_layers) stay high precision.
  int num_layers = 0, bf16_start = 0, bf16_end = 0;
  /// --fp8-param-gather: the distributed optimizer gathers the FP8 linears' weights as FP8 codes
  /// (DataParallel::start_param_gather; docs/fp8.md "FP8 parameter gather").
  bool param_gather = false;
};

class Fp8State {
 public:
  enum class Role { Input, Weight, GradOutput };

  explicit Fp8State(Fp8Settings settings) : settings_(settings) {}
  const Fp8Settings& settings() const { return settings_; }
  bool delayed() const { return settings_.scaling == Fp8Scaling::Delayed; }
  bool blockwise() const { return settings_.scaling == Fp8Scaling::Blockwise; }
  /// Whether global transformer layer `layer` runs its linears in FP8.
  bool fp8_layer(int layer) const;

  /// Registers a scaled tensor under a global name ("<linear weight name>.input" ...); returns
  /// its index. All registrations come before the first amax()/scale() call.
  int add(const std::string& name, Role role);
  /// The elements of a weight this rank casts at its first use in every step and keeps for the
  /// step (a linear's, or a local expert's): what the memory plan counts as FP8 weight codes.
  /// A data-gradient GEMM holds one such weight's transposed codes while it runs: the largest is
  /// a temporary in the plan.
  void add_cast_weight(int64_t elements) {
    cast_weight_elements_ += elements;
    largest_transposed_ = std::max(largest_transposed_, elements);
  }
  int64_t cast_weight_elements() const { return cast_weight_elements_; }
  int64_t largest_transposed_weight() const { return largest_transposed_; }
  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int i) const { return names_[static_cast<size_t>(i)]; }
  ops::Fp8Type type(int i) const;

  /// f32 [1] views on the stream's device: the running step's amax of tensor i (raised by its
  /// casts) and its delayed scale (constant during a step).
  Tensor amax(int i, const Stream& stream);
  Tensor scale(int i, const Stream& stream);
  /// Changes at every begin_step: weight casts are valid for one generation.
  uint64_t generation() const { return generation_; }
  /// The weights changed outside a step (an evaluation follows an optimizer update): the next
  /// use casts them afresh. Running amaxes are left alone (the next begin_step clears them).
  void weights_changed() { ++generation_; }

  /// Start of a step's forward/backward (and of a replay): running amaxes to 0, new weight
  /// generation (an evaluation between steps cannot leave a stale cast or amax behind).
  void begin_step(const Stream& stream);
  /// End of a step (after the optimizer): delayed scaling reduces the amaxes (MAX over `tp`
  /// then `grad_group`; null: a group of one; every rank of both must call it) and updates the
  /// histories and scales (tensorwise: nothing to do).
  void finish_step(comm::Communicator* tp, comm::Communicator* grad_group, const Stream& stream);

  // --------------------------------------------------------------- --fp8-param-gather
  /// A weight whose codes the distributed optimizer gathers: the linear's weight slot and its
  /// parameter-store handles (a fused weight spans first..last, contiguous in the flat buffer).
  struct GatheredWeight {
    int slot = -1;
    int first = -1, last = -1;
    ops::Fp8Tensor codes;  ///< the gathered codes [rows, cols] and the scale they were cast with
  };
  /// Registers the weight of slot `slot` for the FP8 parameter gather (only with
  /// settings().param_gather; before the first gather).
  void add_gathered_weight(int slot, int first, int last);
  std::vector<GatheredWeight>& gathered_weights() { return gathered_; }
  /// Whether an FP8 parameter gather has run (the linears then use its codes).
  bool has_gathered() const { return have_gathered_; }
  /// The codes of weight slot `slot` from the last FP8 parameter gather, or null when there was
  /// none yet (the first step: the linears cast the full weights as without the flag).
  const ops::Fp8Tensor* gathered_codes(int slot) const;
  /// Called by the gather once every weight's codes are in place. `weight_amax` [n_gathered]:
  /// delayed scaling's amaxes of this rank's shards (raised by the shard casts); begin_step puts
  /// them into the weights' running amaxes (the cast belongs to the coming step), so that
  /// finish_step's MAX over TP and the gradient group gives the whole weight's amax.
  void gathered(Tensor weight_amax);

  /// Checkpoint state of tensor i: its amax history then its scale ([history_len + 1] floats).
  std::vector<float> state(int i) const;
  void set_state(int i, const std::vector<float>& values, const Stream& stream);

 private:
  void ensure_buffers(const Stream& stream);
  void upload_scales(const Stream& stream);

  Fp8Settings settings_;
  std::vector<std::string> names_;
  std::vector<Role> roles_;
  std::vector<ops::Fp8ScalingState> host_;  ///< histories and scales (delayed)
  Tensor amax_;   ///< [n, 1] f32 on the device
  Tensor scale_;  ///< [n, 1] f32 on the device
  uint64_t generation_ = 0;
  int64_t cast_weight_elements_ = 0;
  int64_t largest_transposed_ = 0;
  std::vector<GatheredWeight> gathered_;
  bool have_gathered_ = false;
  Tensor gathered_amax_;  ///< [n_gathered] f32: delayed, the shard casts' amaxes (see gathered())
};

}  // namespace megadlm
