// The validated parallel layout of a job: sizes of every dimension and the options that shape
// communication. A value, not a global: tests hold several layouts at once.
// Built and validated from flags by training/arguments, which reports every violated rule
// (docs/rules.md) with flag names; parallel/rank_layout turns it into process groups.
#pragma once
#include "megadlm/parallel/context_parallel/comm_type.h"
#include <optional>
#include <string>
#include <vector>

namespace megadlm {

enum class ShardingStrategy { NoShard, Optim, OptimGrads, OptimGradsParams };

struct ParallelConfig {
  int world_size = 1;
  int tensor_model_parallel_size = 1;    ///< --tensor-model-parallel-size
  int pipeline_model_parallel_size = 1;  ///< --pipeline-model-parallel-size
  int context_parallel_size = 1;         ///< --context-parallel-size
  int expert_model_parallel_size = 1;    ///< --expert-model-parallel-size
  int expert_tensor_parallel_size = 1;   ///< --expert-tensor-parallel-size (resolved: defaults to tp)
  int data_parallel_size = 1;            ///< derived: world / (tp * pp * cp)
  int expert_data_parallel_size = 1;     ///< derived: world / (etp * ep * pp)
  /// Virtual pipeline chunks per rank (0 = not interleaved): --virtual-pipeline-model-parallel-size
  /// or --num-virtual-stages-per-pipeline-rank, or derived from
  /// --num-layers-per-virtual-pipeline-stage (they must agree when several are given).
  int virtual_pipeline_model_parallel_size = 0;
  int microbatch_group_size_per_vp_stage = 0;  ///< resolved: defaults to pp
  std::optional<int> decoder_first_pipeline_num_layers;
  std::optional<int> decoder_last_pipeline_num_layers;
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  bool sequence_parallel = false;
  bool use_tp_pp_dp_mapping = false;     ///< rank order tp-pp-dp instead of tp-cp-ep-dp-pp
  /// Overlap pipeline p2p with compute; resolved: forced false without virtual stages (V-20).
  /// batch_p2p_comm is its negation.
  bool overlap_p2p_comm = false;
  /// All pipeline stages launch parameter all-gathers / gradient reductions at the same
  /// schedule points; align_param_gather is forced false without virtual stages (V-20).
  bool align_param_gather = false;
  bool align_grad_reduce = true;
  std::vector<cp::CommType> cp_comm_type{cp::CommType::P2P};  ///< --cp-comm-type, one or one per layer
  std::vector<int> hierarchical_context_parallel_sizes;

  bool use_distributed_optimizer = false;
  int num_distributed_optimizer_instances = 1;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  long long ddp_bucket_size = 0;         ///< elements; 0 = Megatron's automatic size
  bool ddp_average_in_collective = false; ///< AVG collective instead of pre-scaling by 1/(dp·cp)
  /// FSDP (parallel/data_parallel/fsdp.h): --use-custom-fsdp / --use-megatron-fsdp, or
  /// --use-torch-fsdp2 (resolved: full sharding).
  bool use_custom_fsdp = false;
  bool use_torch_fsdp2 = false;          ///< --use-torch-fsdp2 (for reports; FSDP runs it)
  ShardingStrategy data_parallel_sharding_strategy = ShardingStrategy::OptimGradsParams;
  bool tp_comm_overlap = false;
  int distributed_timeout_minutes = 10;

  /// Rank order string used by the rank generator ("tp-cp-ep-dp-pp" or "tp-pp-dp").
  std::string order() const { return use_tp_pp_dp_mapping ? "tp-pp-dp" : "tp-cp-ep-dp-pp"; }
  int model_parallel_size() const {
    return tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size;
  }
};

const char* sharding_strategy_name(ShardingStrategy s);

}  // namespace megadlm
