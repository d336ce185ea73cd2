// CPU reference of the attention merge (include/megadlm/ops/attention_merge.h): one query row at
// a time, in double, the formula of the header written out. f32 and f64 outputs; lse f32 or the
// output's dtype (cpu_common.h's FloatAccess).
#include <algorithm>
#include <cmath>
#include <limits>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

void attention_merge(Tensor& out, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                     const AttentionMergeArgs& a, const Stream& stream) {
  const detail::FloatAccess o("attention_merge", out, "out");
  const detail::FloatAccess ob("attention_merge", block_out, "block_out");
  const detail::FloatAccess l("attention_merge", lse, "lse");
  const detail::FloatAccess lb("attention_merge", block_lse, "block_lse");
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.num_heads; ++h) {
      for (int64_t i = 0; i < a.seq; ++i) {
        const int64_t stat = (b * a.num_heads + h) * a.seq + i;  // [B, Hq, S]
        const int64_t io = a.out_row0 + i;                        // the row of out
        const int64_t ostat = (b * a.num_heads + h) * a.out_rows() + io;
        const double la = l.get(ostat), lbv = lb.get(stat);
        const double m = std::max(la, lbv);
        if (m == kNegInf) continue;  // neither has seen a key
        const double merged = m + std::log(std::exp(la - m) + std::exp(lbv - m));
        const double wa = std::exp(la - merged), wb = std::exp(lbv - merged);  // 0 for -inf
        const int64_t row = ((b * a.seq + i) * a.num_heads + h) * a.head_dim;  // [B, S, Hq, D]
        const int64_t orow = ((b * a.out_rows() + io) * a.num_heads + h) * a.head_dim;
        for (int64_t d = 0; d < a.head_dim; ++d)
          o.set(orow + d, wa * o.get(orow + d) + wb * ob.get(row + d));
        l.set(ostat, merged);
      }
    }
  }
}

}  // namespace megadlm::ops::cpu
