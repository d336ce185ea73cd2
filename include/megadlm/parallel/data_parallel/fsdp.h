// Fully-sharded data parallelism: Megatron-FSDP's four sharding strategies over the gradient
// group (dp×cp), with the model's blocks as units (docs/parallelism/fsdp.md
// has the worked example).
//
//   strategy            weights      fp32 grads              masters + Adam   per element (CUDA)
//   no_shard            full         full, all-reduced       full             2+4+4+8 = 18
//   optim               full         full, reduce-scattered  shard            6 + 12/d
//   optim_grads         full         shard (slot per unit)   shard            2 + 16/d
//   optim_grads_params  shard        shard (slot per unit)   shard            18/d
//
// Units are the blocks the model announces through ParamHooks (embedding, each layer, the head)
// and the store lays out one bucket per unit (a pipeline-shared tied weight in a bucket of its
// own), each padded so that it splits into d equal, 64-aligned shards; rank r of the group owns
// shard r of every bucket under every strategy (a strategy changes what is kept, never who owns
// an element). Under optim_grads_params a unit's weights are all-gathered into a window just
// before its forward (the next unit prefetched while it computes), freed after it, and gathered
// again for its backward; one gather serves a recomputed unit's re-run forward and its backward.
// Under optim_grads* a unit's full fp32 gradient lives in a zeroed slot only during its
// backward, and is then reduce-scattered and ADDED into this rank's fp32 shard (every
// micro-batch: the accumulated shard is never rescaled, #3023). no_shard and optim accumulate the
// full buffer and reduce each bucket once, on the last micro-batch, when all its gradients are
// final. At most two units are gathered at once (a prefetch that would make a third waits) and at
// most two gradient slots are live.
//
// CUDA: gathers run on their own stream and NCCL communicator (one communicator serialises the
// launch order of everything on it), reduce-scatters on another; events order them with the
// compute stream. Windows and slots come from the compute stream's pool, so their frees are
// ordered after the compute that read them. CPU/MPI: the same calls, blocking.
// Gradients are SUMmed (the loss is normalised globally up front), as in data_parallel.h.
// Expert parameters (ParamDesc::expert, model/moe.h) form a second kind of bucket, sharded over
// the expert-data-parallel group (the ranks holding the same experts) instead of dp×cp: a MoE
// layer is one unit with a dense and an expert bucket, each cut into its own group's shards.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/event.h"
#include "megadlm/parallel/data_parallel/data_parallel.h"
#include "megadlm/parallel/data_parallel/wrapper.h"
#include "megadlm/parallel/parallel_config.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

/// One FSDP unit: the parameters a block of one model chunk registered (the head does not list
/// a tied weight it borrows from the embedding of its own chunk).
struct FsdpUnit {
  int chunk = 0;
  std::vector<int> handles;
};

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::OptimGradsParams;
  /// CUDA with more than one rank: gathers and reductions on communication streams.
  bool overlap = true;
  /// CUDA with one rank: the communication streams and events all the same (the gather is a
  /// copy on the gather stream), so one GPU exercises the multi-GPU ordering (tests).
  bool streams_with_one_rank = false;
  /// Record every gather, release, slot and reduction in trace() (tests and debugging).
  bool trace = false;
};

/// Counters of what the wrapper did (since construction).
struct FsdpStats {
  int64_t all_gathers = 0;      ///< bucket all-gathers of weights (per use, or after the step)
  int64_t reduce_scatters = 0;  ///< bucket reduce-scatters of gradients
  int64_t all_reduces = 0;      ///< bucket all-reduces of gradients (no_shard)
  int max_gathered_units = 0;   ///< most units with gathered weights at one time
  int max_grad_slot_units = 0;  ///< most units with a full gradient slot (bound or reducing)
};

/// One entry of the action trace (FsdpOptions::trace).
struct FsdpAction {
  enum class Kind {
    Needed, Done, BackwardNeeded, BackwardDone,  // the model's hook calls (unit of the first handle)
    Gather, Release,                             // a bucket's weights gathered / freed
    GradSlot, ReduceScatter, Reduce,             // a gradient slot zeroed; a bucket's reduction
    ParamGather,                                 // post-step all-gather (optim, optim_grads)
  };
  Kind kind;
  int unit = -1;
  int bucket = -1;
};

/// How the buckets of a store laid out with FullyShardedDataParallel::buffer_layout split into
/// shards: what the wrapper owns and allocates, and what the memory planner counts
/// (training/memory_plan.h) — one computation for both. Every rank's shards have the same sizes
/// and the same places in the compact shard buffers; only which slice of a bucket it owns
/// depends on its rank.
struct FsdpShardLayout {
  struct Bucket {
    int unit = -1;
    int64_t begin = 0, end = 0;  ///< flat element range, padded (the store's bucket)
    bool expert = false;         ///< expert parameters: cut over expert-dp instead of dp×cp
    int ranks = 1;               ///< the size of the group it is cut over
    /// Elements each rank keeps: (end - begin) / ranks, or the whole bucket under no_shard.
    int64_t shard = 0;
    /// Where the kept elements sit in the compact buffers (the flat offset under no_shard,
    /// whose optimizer state is laid out as the flat buffer).
    int64_t compact_offset = 0;
  };
  std::vector<Bucket> buckets;         ///< the store's buckets, in order
  std::vector<int64_t> unit_elements;  ///< per unit: the padded elements of its buckets
  int64_t flat_size = 0;               ///< S: the padded full buffer
  int64_t shard_elements = 0;          ///< what one rank keeps of every bucket (S under no_shard)

  /// The flat range rank `rank` of bucket b's group owns, and its compact offset.
  OwnedRange owned(size_t b, int rank) const;
  /// The most padded elements of one unit (a gathered window or a gradient slot).
  int64_t largest_unit() const;
};

/// Persistent bytes of the model state this rank allocated (the optimizer's are its own).
struct FsdpBytes {
  int64_t params = 0;  ///< model weights: the full buffer or this rank's shards
  int64_t grads = 0;   ///< fp32 gradients: the full buffer or this rank's shards
};

class FullyShardedDataParallel final : public DataParallelWrapper {
 public:
  /// The store layout for `units` over `d` ranks (expert buckets over `expert_d`, 0: d): one
  /// bucket per unit and parameter kind; buckets padded to 64·d (64·expert_d) elements unless
  /// no_shard; the weight / gradient buffers the strategy shards left to the wrapper.
  /// `num_params`: the store's parameter count.
  static BufferLayout buffer_layout(ShardingStrategy strategy, int d, const std::vector<FsdpUnit>& units,
                                    int num_params, int expert_d = 0);
  /// The shards of `store`, laid out (or materialised) with buffer_layout(strategy, d, units, ...,
  /// expert_d): checks that every bucket holds one unit and splits evenly over its group.
  static FsdpShardLayout shard_layout(const ParameterStore& store, ShardingStrategy strategy, int d,
                                      const std::vector<FsdpUnit>& units, int expert_d = 0);

  /// `store`: materialised with buffer_layout(...). `group`: the gradient group (dp×cp; null: a
  /// single rank). `groups` as in DataParallel, without `inter` (partial gradients summed over
  /// TP; the norm summed over stages; a tied weight's two copies summed over the embedding
  /// group; expert buckets sharded over expert.dp, their norm summed over EP and expert TP).
  /// Initialises this rank's weight shards by global element index. Collective over `group` on
  /// CUDA (it splits off the all-gather communicator).
  FullyShardedDataParallel(ParameterStore& store, std::vector<FsdpUnit> units,
                           std::shared_ptr<comm::Communicator> group, FsdpOptions options,
                           const Stream& compute, DataParallelGroups groups = {});
  ~FullyShardedDataParallel() override;

  const FsdpOptions& options() const { return opt_; }
  int size() const { return size_; }
  int rank() const { return rank_; }
  const std::vector<FsdpUnit>& units() const { return units_; }
  const FsdpStats& stats() const { return stats_; }
  const std::vector<FsdpAction>& trace() const { return trace_; }
  void clear_trace() { trace_.clear(); }
  FsdpBytes persistent_bytes() const;

  // DataParallelWrapper
  const std::vector<OwnedRange>& owned_ranges() const override { return owned_; }
  Tensor optimizer_grads() const override;
  bool optimizer_grads_flat() const override { return !store_.grads_sharded(); }
  Tensor model_shards() const override { return param_shards_; }
  void start_step() override;
  void set_last_micro_batch(bool last) override { last_micro_batch_ = last; }
  void finish_grad_sync() override;
  double grad_sq_norm() override;
  void start_param_gather() override;
  void finish_param_gather() override;
  bool checkpoint_writer() const override;
  std::string summary() const override;

  // ParamHooks
  void params_needed(const std::vector<int>& handles) override;
  void params_done(const std::vector<int>& handles) override;
  void backward_needed(const std::vector<int>& handles) override;
  void grads_ready(const std::vector<int>& handles) override;
  void backward_done(const std::vector<int>& handles) override;

 private:
  struct Bucket {
    int unit = -1;
    int64_t begin = 0, end = 0;  // flat range
    bool shared = false;         // a tied weight shared across pipeline stages
    bool expert = false;         // expert parameters: sharded over expert-dp
    comm::Communicator* group = nullptr;     // the bucket's FSDP group (null: one rank)
    comm::Communicator* ag_group = nullptr;  // its all-gather communicator
    int size = 1, rank = 0;      // the group's size and this rank's place in it
    // optim_grads_params: the gathered window (bound in the store) and who is reading it.
    int users = 0;
    Tensor window;
    Event gathered;
    bool waited = false;         // the compute stream has waited for `gathered`
    // optim_grads*: the full gradient slot of the current backward.
    int grad_users = 0;
    Tensor grad_slot;
    // no_shard / optim: gradients not final yet this step, and whether it was reduced.
    int pending = 0;
    bool reduced = false;
    Event reduce_done;
    // optim / optim_grads: the post-step all-gather of the updated weights.
    bool param_stale = false;
    Event param_ready;
  };
  /// A reduce-scatter on the communication stream whose buffers must outlive it.
  struct InFlight {
    int unit = -1;
    Tensor slot, scratch;
    Event done;
  };

  int64_t shard_size(const Bucket& b) const { return (b.end - b.begin) / b.size; }
  std::vector<int> buckets_of(const std::vector<int>& handles) const;
  int unit_of(const std::vector<int>& handles) const;
  void record(FsdpAction::Kind kind, int unit, int bucket = -1);
  bool sharded() const { return opt_.strategy != ShardingStrategy::NoShard; }
  int gathered_units() const;
  int grad_slot_units() const;
  /// optim_grads_params: starts the gather of bucket b into a new window (no-op if gathered).
  void gather(int b);
  /// Makes the compute stream wait for bucket b's gather.
  void wait_gathered(int b);
  void release(int b);
  /// Gathers the buckets of unit u (forward: the next, backward: the previous) ahead of use,
  /// unless that would hold a third unit.
  void prefetch(int u);
  void acquire_grad_slot(int b);
  void reduce_scatter_slot(int b);
  void retire_oldest();
  void launch_reduce(int b);
  void wait_param_gather(int b);
  /// Calls fn(desc, grad offset in optimizer_grads(), count) for every owned piece.
  template <typename Fn>
  void for_each_owned_piece(Fn&& fn) const;

  ParameterStore& store_;
  std::vector<FsdpUnit> units_;
  std::shared_ptr<comm::Communicator> group_, ag_group_;
  DataParallelGroups groups_;  // without groups of one
  std::shared_ptr<comm::Communicator> expert_ag_group_;
  FsdpOptions opt_;
  Stream compute_, ag_stream_, rs_stream_;
  bool overlap_ = false;
  int size_ = 1, rank_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<int>> unit_buckets_;
  std::vector<OwnedRange> owned_;  // per bucket
  Tensor param_shards_;            // optim_grads_params: this rank's weights, compact
  Tensor grad_shards_;             // optim_grads*: this rank's fp32 gradients, compact
  std::deque<InFlight> in_flight_;
  bool last_micro_batch_ = false;
  bool gather_in_flight_ = false;
  FsdpStats stats_;
  std::vector<FsdpAction> trace_;
};

}  // namespace megadlm
