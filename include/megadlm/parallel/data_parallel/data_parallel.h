// Data parallelism over the flat gradient buffer (Megatron's DistributedDataParallel;
// docs/parallelism/data_parallel.md).
//
// Gradients accumulate over a step's micro-batches in the fp32 buffer of the ParameterStore,
// which is cut into buckets in backward order. On the last micro-batch, each bucket's collective
// is launched as soon as the model reports all its gradients final (--overlap-grad-reduce, on a
// communication stream overlapping the rest of backward) or all at once at the end:
//   * plain DDP: all-reduce (SUM) of the bucket; every rank then holds the full gradient
//   * distributed optimizer: reduce-scatter (SUM); rank r keeps shard r of every bucket, in a
//     compact buffer that is exactly the optimizer's layout (training/optimizer.h); after the
//     step, each bucket's parameters are all-gathered from the shards (--overlap-param-gather:
//     asynchronously, each block waiting for its bucket just before its forward).
// With N distributed-optimizer instances ("partial DistOpt") the reduce-scatter and the
// all-gather run inside an instance and the shards are then all-reduced across instances.
// Gradients are SUMmed, not averaged: the loss is normalised by the global token count up front
// (docs/architecture.md promise 1), so the sum over ranks is already the gradient of the global loss.
// Expert parameters (ParamDesc::expert) sit in buckets of their own that reduce (and shard)
// over the expert-data-parallel group: the ranks holding the same experts
// (docs/parallelism/expert_parallel.md).
#pragma once
#include "megadlm/parallel/fp8_state.h"
#include <cstdint>
#include <memory>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/event.h"
#include "megadlm/parallel/data_parallel/wrapper.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

struct NormSums;  // parallel/data_parallel/grad_norm_runs.h

/// The groups of expert parameters (all null: no experts, or a single rank).
struct ExpertGradGroups {
  std::shared_ptr<comm::Communicator> dp;  ///< expert-dp: expert gradients reduce over it
  std::shared_ptr<comm::Communicator> ep;  ///< expert model parallel: disjoint experts (norm)
  std::shared_ptr<comm::Communicator> tp;  ///< expert tensor parallel: split experts (norm)
};

/// The groups a data-parallel wrapper talks over besides its gradient group, each null (or a
/// group of one) where that dimension is absent; call sites name them
/// (`{.tp = groups.tp, .pp = groups.pp}`).
struct DataParallelGroups {
  /// With --num-distributed-optimizer-instances > 1 (DataParallel under the distributed
  /// optimizer only): the ranks holding the same shard in the other instances; the shards are
  /// all-reduced over it after the reduce-scatter.
  std::shared_ptr<comm::Communicator> inter = nullptr;
  /// Tensor parallel: gradients of replicated parameters that each TP rank computes only in part
  /// (TpSlice::partial_grad) are summed over it, and the gradient norm counts replicated
  /// parameters once.
  std::shared_ptr<comm::Communicator> tp = nullptr;
  /// Pipeline: the gradient norm sums over the stages.
  std::shared_ptr<comm::Communicator> pp = nullptr;
  /// The first and last stage's embedding group (none: no tied weight across stages): the two
  /// copies' gradients are summed over it before their bucket reduces.
  std::shared_ptr<comm::Communicator> embedding = nullptr;
  /// The groups of the expert parameters' buckets.
  ExpertGradGroups expert = {};

  /// The same groups, each group of one rank replaced by null (what the wrappers keep).
  DataParallelGroups without_single_ranks() const;

  /// The squared gradient norm of the whole model from this rank's sums (grad_norm_runs.h):
  /// replicated parameters count on (expert-)TP rank 0; the dense share is summed over
  /// `dense_shards` (the gradient group whose ranks hold disjoint shards; null: replicas) and
  /// TP, the expert share (when `has_experts`) over `expert_shards` (likewise), EP and expert
  /// TP, both over the pipeline. Collective over every group it sums over; groups of one must
  /// be null (without_single_ranks).
  double global_sq_norm(const NormSums& sums, comm::Communicator* dense_shards,
                        comm::Communicator* expert_shards, bool has_experts, const Stream& stream) const;
};

struct DataParallelOptions {
  bool overlap_grad_reduce = false;
  bool distributed_optimizer = false;
  bool overlap_param_gather = false;
  int64_t bucket_size = 0;  ///< --ddp-bucket-size; 0: Megatron's max(4e7, 1e6 * dp) with overlap
};

class DataParallel final : public DataParallelWrapper {
 public:
  /// The layout the store must be materialised with for these options, `dp_size` ranks in the
  /// gradient group and `expert_dp_size` in the expert-dp group (0: dp_size).
  static BufferLayout buffer_layout(const DataParallelOptions& options, int dp_size,
                                    int expert_dp_size = 0);

  /// `group`: the gradient-reduction group (dp-cp, or under the distributed optimizer with
  /// several instances its intra-instance slice); null means a single rank. `compute`: the
  /// stream the model runs on. `groups`: the other groups it talks over (DataParallelGroups).
  DataParallel(ParameterStore& store, std::shared_ptr<comm::Communicator> group,
               DataParallelOptions options, const Stream& compute, DataParallelGroups groups = {});

  const DataParallelOptions& options() const { return opt_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  /// What this rank's optimizer owns: its shard of every bucket, or the whole buffer.
  const std::vector<OwnedRange>& owned_ranges() const override { return owned_; }
  /// The reduced gradients in the optimizer's compact layout (valid after finish_grad_sync).
  Tensor optimizer_grads() const override;

  /// Call once at the start of every step (before any backward).
  void start_step() override;
  /// Call before each backward: `last` when it is the final micro-batch of its model chunk
  /// (only then may buckets reduce, as in Megatron's no_sync).
  void set_last_micro_batch(bool last) override { last_micro_batch_ = last; }
  /// Both at once, for a single chunk: start_step() on the first call of a step is the caller's.
  void begin_micro_batch(bool last) { set_last_micro_batch(last); }
  void params_needed(const std::vector<int>& handles) override;
  void grads_ready(const std::vector<int>& handles) override;
  /// After the last backward: launches what is left, waits for every reduction, and sums the
  /// partial gradients of replicated parameters over TP (Megatron's finalize_model_grads).
  void finish_grad_sync() override;
  /// Sum of squares of the reduced gradients over the whole model, each element counted once
  /// (split parameters summed over TP, replicated ones counted on TP rank 0).
  double grad_sq_norm() override;
  /// After the optimizer step (distributed optimizer): all-gathers the updated parameters.
  void start_param_gather() override;
  /// Waits for every outstanding parameter all-gather.
  void finish_param_gather() override;
  /// --fp8-param-gather: the weights registered in `state` (Fp8State::gathered_weights) are
  /// gathered as FP8 codes cast by each shard's owner with the coming step's scale; the other
  /// parameters of their buckets travel as before (docs/fp8.md "FP8 parameter gather").
  void set_fp8_param_gather(std::shared_ptr<Fp8State> state);
  /// Without the distributed optimizer rank 0 of the group writes everything; with it every
  /// rank of the first instance writes its shard.
  bool checkpoint_writer() const override {
    return opt_.distributed_optimizer ? !groups_.inter || groups_.inter->rank() == 0 : rank_ == 0;
  }
  std::string summary() const override;

 private:
  void launch_bucket(size_t b);
  /// The reduction group of bucket b (null: one rank) and this rank's place in it.
  comm::Communicator* group_of(size_t b) const;
  int group_size(size_t b) const;
  void reduce_tp_partial_grads();
  void reduce_embedding_group_grads();
  /// start_param_gather with --fp8-param-gather; `s` the gather's stream.
  void gather_with_fp8_weights(const Stream& s);
  const Stream& comm_stream() const { return overlap_ ? comm_ : compute_; }

  ParameterStore& store_;
  /// Calls fn(param, compact offset, flat begin, count) for every piece of every parameter in
  /// the owned ranges.
  template <typename Fn>
  void for_each_owned_piece(Fn&& fn) const;

  std::shared_ptr<comm::Communicator> group_;
  DataParallelGroups groups_;  // without groups of one
  std::vector<bool> deferred_;        // per bucket: waits for the embedding-group reduction
  DataParallelOptions opt_;
  Stream compute_, comm_;
  bool overlap_ = false;  // a separate communication stream is in use
  int size_ = 1, rank_ = 0;
  std::vector<OwnedRange> owned_;
  Tensor grad_shards_;                // distributed optimizer: compact reduced gradients
  std::vector<int> pending_;          // per bucket: parameters whose gradients are not final yet
  std::vector<bool> launched_;
  std::vector<bool> param_ready_;     // per bucket: gathered parameters are usable
  std::vector<Event> done_;           // per bucket: its collective finished (comm stream)
  bool last_micro_batch_ = false;
  bool gather_in_flight_ = false;
  std::shared_ptr<Fp8State> fp8_;     // --fp8-param-gather
};

}  // namespace megadlm
