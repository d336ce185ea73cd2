// Mixture-of-experts part of the architecture, resolved from Megatron's MoE flags
// (docs/parallelism/expert_parallel.md): which layers are MoE, the router, load balancing, token
// dropping, the experts and how tokens travel to them. num_experts == 0 means a dense model.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace megadlm {

enum class MoeScoreFunction { Softmax, Sigmoid };
/// --moe-router-load-balancing-type: aux_loss, seq_aux_loss, sinkhorn, none, and MegaDLMs'
/// softmax_expert_choice (experts choose tokens).
enum class MoeLoadBalancing { AuxLoss, SeqAuxLoss, Sinkhorn, None, ExpertChoice };
enum class MoeDispatcher { AllGather, AllToAll };
enum class MoeDropPolicy { Probs, Position };

struct MoeConfig {
  int num_experts = 0;                 ///< experts per MoE layer (0: no MoE layer)
  /// Resolved --moe-layer-freq: moe_layers[i] says whether global layer i is an MoE layer.
  std::vector<bool> moe_layers;
  int topk = 2;                        ///< --moe-router-topk
  MoeScoreFunction score = MoeScoreFunction::Softmax;
  bool pre_softmax = false;
  std::optional<float> topk_scaling_factor;
  int num_groups = 0;                  ///< --moe-router-num-groups (0: no group-limited routing)
  int group_topk = 0;                  ///< --moe-router-group-topk
  int topk_limited_devices = 0;        ///< --moe-router-topk-limited-devices (0: off)
  MoeLoadBalancing load_balancing = MoeLoadBalancing::AuxLoss;
  float aux_loss_coeff = 0.0f;
  float z_loss_coeff = 0.0f;           ///< 0: no z-loss
  bool expert_bias = false;            ///< --moe-router-enable-expert-bias (aux-loss-free balancing)
  float bias_update_rate = 1e-3f;
  /// --moe-router-force-load-balancing: random router logits (benchmarks only, ops::moe_random_logits)
  bool force_load_balancing = false;
  std::optional<float> capacity_factor;  ///< unset: dropless
  bool pad_to_capacity = false;
  MoeDropPolicy drop_policy = MoeDropPolicy::Probs;
  bool batch_level_expert_choice = false;  ///< expert choice over all rows, not per sequence
  int ffn_hidden_size = 0;             ///< per-expert width (resolved: --ffn-hidden-size)
  int shared_expert_size = 0;          ///< total width of the shared experts (0: none)
  bool grouped_gemm = false;
  MoeDispatcher dispatcher = MoeDispatcher::AllGather;

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const {
    return enabled() && layer >= 0 && layer < static_cast<int>(moe_layers.size()) &&
           moe_layers[static_cast<size_t>(layer)];
  }
  /// Number of MoE layers.
  int num_moe_layers() const {
    int n = 0;
    for (bool b : moe_layers) n += b ? 1 : 0;
    return enabled() ? n : 0;
  }
};

}  // namespace megadlm
