// AdamW over the flat parameter buffer, or over this rank's shards of it (distributed
// optimizer, FSDP): fp32 master weights and Adam moments exist only for the owned ranges, in one
// compact buffer; the step reads the gradients (compact layout, or the owned slices of a full
// buffer), updates the masters and writes them (cast to the model dtype) into the owned ranges of
// the model weights (the store's flat buffer, or the compact shards of FSDP-sharded weights).
// When the model weights are already fp32 (the CPU backend) the masters may be the weights
// themselves, as Megatron's distributed optimizer does for fp32 parameters: no second copy.
// Weight decay is applied to parameters registered with weight_decay (not norms or biases).
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

/// Where a step reads gradients and writes the updated weights (the data-parallel wrapper's
/// layout, parallel/data_parallel/wrapper.h).
struct OptimizerLayout {
  bool flat_grads = false;    ///< step()'s gradients are indexed by flat offset, not compact
  Tensor model_shards;        ///< defined: the owned weights in the compact layout (FSDP)
  bool alias_master = false;  ///< the masters are the model weights (model dtype = state dtype)
};

class AdamWOptimizer {
 public:
  /// Allocates masters (unless aliased) and moments for `owned` (sorted, disjoint) and
  /// initialises the masters with the exact fp32 initial values of those elements.
  AdamWOptimizer(ParameterStore& store, std::vector<OwnedRange> owned, const OptimizerConfig& config,
                 const Stream& stream, OptimizerLayout layout = {});

  /// One step with learning rate `lr` on `grads` * `grad_scale` (f32, the layout's indexing;
  /// grad_scale is the clip coefficient, 1 without clipping). `grads` are read, not changed:
  /// the step is bitwise the one on gradients scaled first (ops::AdamWArgs::grad_scale).
  void step(const Tensor& grads, double lr, float grad_scale, const Stream& stream);
  /// The model weights of the owned ranges := the masters rounded to the model dtype (what a
  /// step writes; after a checkpoint load). Nothing to do when the masters are the weights.
  void write_model_weights(const Stream& stream);

  const std::vector<OwnedRange>& owned() const { return owned_; }
  int64_t compact_size() const { return compact_size_; }
  /// The masters of compact elements [compact, compact + count), which must lie in one owned
  /// range (a view: of the master buffer, or of the model weights when aliased).
  Tensor master_slice(int64_t compact, int64_t count) const;
  /// The compact master buffer (undefined when the masters alias the model weights).
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  bool masters_alias_weights() const { return layout_.alias_master; }
  /// Bytes this optimizer allocated: masters (0 when aliased) and both moments.
  int64_t state_bytes() const;
  int64_t steps() const { return steps_; }
  /// Adam's step count (bias correction), restored from a checkpoint.
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  /// The owned range holding compact element `compact`.
  const OwnedRange& range_of(int64_t compact) const;
  /// Model weights of compact elements [compact, compact + count) (inside range r).
  Tensor model_slice(const OwnedRange& r, int64_t compact, int64_t count) const;

  ParameterStore& store_;
  std::vector<OwnedRange> owned_;
  OptimizerConfig cfg_;
  OptimizerLayout layout_;
  int64_t compact_size_ = 0;
  int64_t steps_ = 0;
  Tensor master_, exp_avg_, exp_avg_sq_;
};

}  // namespace megadlm
