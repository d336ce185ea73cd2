// Internal to training/: what the rule files share while resolving and validating flags
// (argument_rules.cpp: model, optimizer, data, diffusion, device; parallel_rules.cpp: world,
// TP/CP/PP/DP, batch sizes, recomputation, and what this single-process build cannot run).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/model/moe_config.h"
#include "training/arguments/argument_state.h"

namespace megadlm::training::detail {

// Bounds every parallel size and the world size, so that products of sizes (and mbs · dp · pp)
// cannot overflow int64 while rules compute them.
inline constexpr int64_t kMaxParallelSize = 1 << 20;

inline std::string num(int64_t v) { return std::to_string(v); }
inline std::string num(double v) { return python_float_repr(v); }

/// "1, 2, 4, 8, 16": the valid values when something must divide `n`.
std::string divisors_text(int64_t n);

/// Sizes resolved so far, shared by the rule groups.
struct Ctx {
  bool dry_run = false;
  std::string world_source;  ///< "`--world-size 16`" or "from the launcher"
  int64_t world = 1, tp = 1, pp = 1, cp = 1, ep = 1, etp = 1;
  bool sizes_ok = true;      ///< every parallel size >= 1
  bool dense_ok = false;     ///< world divisible by tp·pp·cp (dp known)
  bool expert_ok = false;    ///< world divisible by etp·ep·pp (edp known)
  int64_t dp = 1, edp = 1;
  int64_t transformer_pp = 1;
  int64_t vpp = 0;           ///< 0 = not interleaved
  int64_t num_micro = 0;     ///< 0 = unknown
  bool model_ok = true;      ///< num_layers, hidden, heads, seq set and positive
  int64_t num_layers = 0, hidden = 0, heads = 0, seq = 0;
  int64_t ffn = 0, kv = 0, query_groups = 0;
  std::string world_text() const { return "world size " + num(world) + " (" + world_source + ")"; }
};

// parallel_rules.cpp, called in this order by resolve_and_validate (the model-shape rules run
// between resolve_world and check_tensor_parallel).
void resolve_world(ArgState& a, Ctx& c, Diagnostics& d);
void check_tensor_parallel(ArgState& a, Ctx& c, Diagnostics& d);
void check_pipeline(ArgState& a, Ctx& c, Diagnostics& d);
void check_context_parallel(ArgState& a, Ctx& c, Diagnostics& d);
void check_batch(ArgState& a, Ctx& c, Diagnostics& d);
void check_recompute(ArgState& a, Ctx& c, Diagnostics& d);
void check_data_parallel(ArgState& a, Ctx& c, Diagnostics& d);
void check_support(ArgState& a, Ctx& c, Diagnostics& d);

// moe_rules.cpp: the MoE flags (after the model shape and the parallel sizes are resolved).
void check_moe(ArgState& a, Ctx& c, Diagnostics& d);
/// --moe-layer-freq: an int N (layer i is MoE iff i % N == 0) or a Python list expression of
/// 0/1 ("[1,0]*4", "([0]+[1]*23)"); `error` says what is wrong ("" = fine).
std::vector<bool> parse_moe_layer_freq(const std::string& text, int64_t num_layers, std::string& error);

}  // namespace megadlm::training::detail
