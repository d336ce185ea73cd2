// How the model tells a data-parallel (or sharded) wrapper when parameters are about to be read
// and when their gradients are final, without knowing anything about communication. The model
// calls these at block granularity (embedding, each layer, the head) in execution order.
#pragma once
#include <vector>

namespace megadlm {

class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  /// Forward is about to read these parameters (wait for their all-gather, if one is in flight).
  virtual void params_needed(const std::vector<int>& handles) = 0;
  /// Backward has added this micro-batch's last contribution to these parameters' gradients.
  virtual void grads_ready(const std::vector<int>& handles) = 0;
};

}  // namespace megadlm
