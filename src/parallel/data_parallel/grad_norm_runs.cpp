// Runs of gradient-norm pieces (include/megadlm/parallel/data_parallel/grad_norm_runs.h).
#include "megadlm/parallel/data_parallel/grad_norm_runs.h"
#include <algorithm>
#include "megadlm/core/error.h"

namespace megadlm {

std::vector<NormPiece> coalesce_norm_pieces(std::vector<NormPiece> pieces, int64_t max_run) {
  std::sort(pieces.begin(), pieces.end(),
            [](const NormPiece& a, const NormPiece& b) { return a.offset < b.offset; });
  std::vector<NormPiece> runs;
  for (const NormPiece& p : pieces) {
    if (p.count <= 0) continue;
    if (!runs.empty()) {
      NormPiece& last = runs.back();
      MDLM_CHECK(last.offset + last.count <= p.offset, "gradient-norm pieces overlap: [", last.offset,
                 ", ", last.offset + last.count, ") and [", p.offset, ", ", p.offset + p.count, ")");
      if (last.offset + last.count == p.offset && last.target == p.target && last.count + p.count <= max_run) {
        last.count += p.count;
        continue;
      }
    }
    runs.push_back(p);
  }
  return runs;
}

}  // namespace megadlm
