// Which transformer layers each pipeline stage (and virtual chunk) builds (Megatron's
// get_num_layers_to_build). Worked example, L = 16 layers, pp = 4, vpp = 2 (chunk size
// c = L / (pp * vpp) = 2):
// chunk v of stage p starts at v * (L / vpp) + p * c, so stage 0 holds {0,1} and {8,9}, stage 1
// {2,3} and {10,11}, stage 2 {4,5} and {12,13}, stage 3 {6,7} and {14,15}. Uneven splits
// (--decoder-first/last-pipeline-num-layers F, La; no interleaving): the first stage builds F,
// the last La, the others share the rest evenly; stage p > 0 starts at F + (p - 1) * mid.
#pragma once
#include <optional>
#include <vector>

namespace megadlm::pp {

struct LayerRange {
  int first = 0;  ///< global index of the chunk's first layer
  int count = 0;
};

/// The layer range of each of the `vpp` chunks (vpp = 1 without interleaving) of `pp_rank`.
/// Throws with the offending values when the layers do not split as Megatron requires.
std::vector<LayerRange> stage_layers(int num_layers, int pp_size, int vpp, int pp_rank,
                                     std::optional<int> first_stage_layers = std::nullopt,
                                     std::optional<int> last_stage_layers = std::nullopt);

}  // namespace megadlm::pp
