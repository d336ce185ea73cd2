// The one place where a run's parallel layout is wired (torchtitan's "parallelize" step): from
// the configuration and the process groups to this rank's model chunks, parameter store,
// data-parallel wrapper and optimizer, and the groups the training loop reduces over. The model
// code is written for one rank; what parallelism changes around it is decided here, in a fixed
// order:
//   1. the model-parallel groups (TP, CP, EP, expert TP, SP) every layer receives;
//   2. this rank's pipeline chunks (layers of its virtual stages; embedding on the first, head on
//      the last), registering their slices of the parameters;
//   3. the flat parameter and gradient buffers, laid out for the data-parallel buckets;
//   4. the data-parallel wrapper over the gradient group (dp×cp, or the distributed optimizer's
//      intra-instance slice) and the optimizer over the ranges this rank owns. With
//      --use-megatron-fsdp (or --use-torch-fsdp2) the wrapper is FSDP (parallel/data_parallel/
//      fsdp.h) with the chunks' blocks as its units and the buffers laid out for them; otherwise
//      DDP or the distributed optimizer (data_parallel.h).
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/model_runtime.h"
#include "megadlm/model/moe.h"
#include "megadlm/parallel/data_parallel/data_parallel.h"
#include "megadlm/parallel/data_parallel/data_shard.h"
#include "megadlm/parallel/data_parallel/fsdp.h"
#include "megadlm/parallel/data_parallel/wrapper.h"
#include "megadlm/parallel/model_parallel.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/optimizer.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

/// This rank's part of the model with everything parallelism adds around it. Not movable: the
/// chunks and the wrapper hold references into the store.
struct ParallelModel {
  ModelRuntime runtime;
  ModelParallel model_parallel;
  ParameterStore store;
  std::vector<std::unique_ptr<GptModel>> chunks;  ///< pipeline chunks (one without virtual stages)
  std::unique_ptr<DataParallelWrapper> data_parallel;  ///< DataParallel or FullyShardedDataParallel
  FullyShardedDataParallel* fsdp = nullptr;           ///< data_parallel when it is FSDP, else null
  std::unique_ptr<AdamWOptimizer> optimizer;
  /// MoE models: expert biases, the aux-loss weight and the step's statistics (runtime.moe).
  std::unique_ptr<MoeStepState> moe;

  // The groups the training loop talks over (null: a single process).
  int rank = 0;                                    ///< world rank
  std::shared_ptr<comm::Communicator> world;
  std::shared_ptr<comm::Communicator> data_group;  ///< dp: decides which samples this rank reads
  std::shared_ptr<comm::Communicator> grad_group;  ///< dp×cp: gradients and loss sums
  std::shared_ptr<comm::Communicator> expert_grad_group;  ///< expert-dp: expert gradients
  std::shared_ptr<comm::Communicator> pipeline;    ///< pp
  /// The distributed optimizer's across-instance group (null with one instance).
  std::shared_ptr<comm::Communicator> dist_opt_inter;
  DataShard data_shard;
  int pp_rank = 0, pp_size = 1;

  ParallelModel() = default;
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  int virtual_stages() const { return static_cast<int>(chunks.size()); }
  int grad_group_size() const { return grad_group ? grad_group->size() : 1; }
};

/// Builds this rank's ParallelModel for `config`. `groups`: the process groups of a
/// multi-process run (null: a single process). Collective over the groups only through the
/// data-parallel wrapper's construction (none today).
/// The FP8 settings of a run with --fp8-format (delayed or tensorwise recipe).
Fp8Settings fp8_settings(const RunConfig& cfg);

std::unique_ptr<ParallelModel> parallelize(const RunConfig& config,
                                           const parallel::ProcessGroups* groups);

}  // namespace megadlm
