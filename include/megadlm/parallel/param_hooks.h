// How the model tells a data-parallel (or sharded) wrapper when parameters are about to be read
// and when their gradients are final, without knowing anything about communication. The model
// calls these at block granularity (embedding, each layer, the head) in execution order:
//
//   forward of a block:   params_needed(h) ... compute ... params_done(h)
//   backward of a block:  backward_needed(h) ... compute ... grads_ready(final) backward_done(h)
//
// A recomputed unit announces backward_needed for all its layers before re-running their
// forward (with no hooks) and backward_done after their backwards, so one gather serves both.
// DDP and the distributed optimizer use params_needed and grads_ready; FSDP
// (data_parallel/fsdp.h) gathers on *_needed, frees on *_done and reduce-scatters on
// backward_done. The calls nest: a block may announce handles already announced by an
// enclosing recomputed unit.
#pragma once
#include <vector>

namespace megadlm {

class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  /// Forward is about to read these parameters (wait for their all-gather, if one is in flight).
  virtual void params_needed(const std::vector<int>& handles) = 0;
  /// Forward has finished reading these parameters (a sharded wrapper may free its gathered copy).
  virtual void params_done(const std::vector<int>& handles) { (void)handles; }
  /// Backward (or the recomputation inside it) is about to read these parameters and add into
  /// their gradients.
  virtual void backward_needed(const std::vector<int>& handles) { (void)handles; }
  /// Backward has added this micro-batch's last contribution to these parameters' gradients.
  virtual void grads_ready(const std::vector<int>& handles) = 0;
  /// Backward has finished reading these parameters and adding into their gradients for this
  /// micro-batch (which need not be final: a tied weight has a second user).
  virtual void backward_done(const std::vector<int>& handles) { (void)handles; }
};

}  // namespace megadlm
