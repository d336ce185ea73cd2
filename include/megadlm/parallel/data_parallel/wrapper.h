// What the training loop asks of a data-parallel wrapper, whichever one the layout chose
// (training/parallelize.cpp): plain DDP or the distributed optimizer (data_parallel.h), or FSDP
// with one of Megatron-FSDP's sharding strategies (fsdp.h). The wrapper also receives the
// model's ParamHooks calls. One step, in the trainer's order:
//   start_step()                      before the first backward
//   set_last_micro_batch(m == M - 1)  before each backward
//   finish_grad_sync()                after the last backward: every reduction done
//   grad_sq_norm(), optimizer_grads() the reduced gradients in the optimizer's layout
//   (the optimizer steps)             on owned_ranges()
//   start_param_gather()              the updated weights, where another rank owns them
#pragma once
#include <string>
#include <vector>
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/param_hooks.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

class DataParallelWrapper : public ParamHooks {
 public:
  /// What this rank's optimizer owns: its shard of every bucket, or the whole buffer.
  virtual const std::vector<OwnedRange>& owned_ranges() const = 0;
  /// The reduced gradients the optimizer reads (valid after finish_grad_sync): the compact
  /// layout of owned_ranges(), or the full flat buffer when optimizer_grads_flat().
  virtual Tensor optimizer_grads() const = 0;
  /// True when optimizer_grads() is indexed by flat offset (the owned slices of a full buffer).
  virtual bool optimizer_grads_flat() const { return false; }
  /// FSDP-sharded weights: this rank's owned weights in the compact layout (the optimizer writes
  /// them there); undefined when the store holds the full weights.
  virtual Tensor model_shards() const { return Tensor(); }

  virtual void start_step() = 0;
  /// Call before each backward: `last` when it is the final micro-batch of its model chunk.
  virtual void set_last_micro_batch(bool last) = 0;
  virtual void finish_grad_sync() = 0;
  /// Sum of squares of the reduced gradients over the whole model, each element counted once.
  virtual double grad_sq_norm() = 0;
  virtual void start_param_gather() = 0;
  virtual void finish_param_gather() = 0;

  /// Whether this rank writes its owned ranges into a checkpoint (each element has exactly one
  /// writer: the replicas of a range stay silent).
  virtual bool checkpoint_writer() const = 0;
  /// For the start-up line: ", distributed optimizer, ...", each item with a leading comma.
  virtual std::string summary() const = 0;
};

}  // namespace megadlm
