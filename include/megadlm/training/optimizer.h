// AdamW over the flat parameter buffer, or over this rank's shards of it (distributed
// optimizer): fp32 master weights and Adam moments exist only for the owned ranges, in one
// compact buffer; the step reads the gradients in the same compact layout, updates the masters
// and writes them (cast to the model dtype) back into the owned ranges of the model weights.
// Weight decay is applied to parameters registered with weight_decay (not norms or biases).
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

class AdamWOptimizer {
 public:
  /// Allocates masters and moments for `owned` (sorted, disjoint) and initialises the masters
  /// with the exact fp32 initial values of those elements.
  AdamWOptimizer(ParameterStore& store, std::vector<OwnedRange> owned, const OptimizerConfig& config,
                 const Stream& stream);

  /// One step with learning rate `lr` on `grads` (f32, compact layout, already clipped).
  void step(const Tensor& grads, double lr, const Stream& stream);

  const std::vector<OwnedRange>& owned() const { return owned_; }
  int64_t compact_size() const { return compact_size_; }
  const Tensor& master() const { return master_; }
  const Tensor& exp_avg() const { return exp_avg_; }
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  int64_t steps() const { return steps_; }
  /// Adam's step count (bias correction), restored from a checkpoint.
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  ParameterStore& store_;
  std::vector<OwnedRange> owned_;
  OptimizerConfig cfg_;
  int64_t compact_size_ = 0;
  int64_t steps_ = 0;
  Tensor master_, exp_avg_, exp_avg_sq_;
};

}  // namespace megadlm
