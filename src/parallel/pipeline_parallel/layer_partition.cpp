#include "megadlm/parallel/pipeline_parallel/layer_partition.h"
#include "megadlm/core/error.h"

namespace megadlm::pp {

std::vector<LayerRange> stage_layers(int num_layers, int pp_size, int vpp, int pp_rank,
                                     std::optional<int> first, std::optional<int> last) {
  MDLM_CHECK(pp_size >= 1 && vpp >= 1 && pp_rank >= 0 && pp_rank < pp_size,
             "bad pipeline layout: rank ", pp_rank, " of ", pp_size, ", ", vpp, " virtual stages");
  if (first || last) {
    MDLM_CHECK(vpp == 1, "uneven pipeline splits (--decoder-first/last-pipeline-num-layers) cannot "
               "be combined with virtual stages");
    const int f = first.value_or(-1), l = last.value_or(-1);
    int rest = num_layers - (first ? f : 0) - (last ? l : 0);
    const int middle_stages = pp_size - (first ? 1 : 0) - (last ? 1 : 0);
    MDLM_CHECK(rest >= 0 && (middle_stages > 0 ? rest % middle_stages == 0 : rest == 0),
               num_layers, " layers minus the first/last stages' ", f, "/", l,
               " do not split evenly over the remaining ", middle_stages, " stages");
    const int mid = middle_stages > 0 ? rest / middle_stages : 0;
    if (first && pp_rank == 0) return {{0, f}};
    if (last && pp_rank == pp_size - 1) return {{num_layers - l, l}};
    const int start = (first ? f : 0) + (pp_rank - (first ? 1 : 0)) * mid;
    return {{start, mid}};
  }
  MDLM_CHECK(num_layers % (pp_size * vpp) == 0, num_layers, " layers do not split into ", pp_size,
             " pipeline stages x ", vpp, " virtual stages");
  const int chunk = num_layers / (pp_size * vpp);
  std::vector<LayerRange> out;
  for (int v = 0; v < vpp; ++v) out.push_back({v * (num_layers / vpp) + pp_rank * chunk, chunk});
  return out;
}

}  // namespace megadlm::pp
