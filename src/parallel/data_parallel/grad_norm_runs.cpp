// Runs of gradient-norm pieces (include/megadlm/parallel/data_parallel/grad_norm_runs.h).
#include "megadlm/parallel/data_parallel/grad_norm_runs.h"
#include <algorithm>
#include "megadlm/core/error.h"
#include "megadlm/ops/reduce.h"

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

int norm_target(const ParamDesc& d, NormTpGroups groups) {
  if (d.expert) return d.replicated() && groups.expert_tp ? kNormExpertReplicated : kNormExpertSplit;
  return d.replicated() && groups.tp ? kNormReplicated : kNormSplit;
}

NormSums sum_norm_pieces(const Tensor& grads, std::vector<NormPiece> pieces, const Stream& stream) {
  const DType acc = stream.device().is_cpu() && grads.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor into[4];  // created on first use: a target without pieces costs no read-back
  for (const NormPiece& run : coalesce_norm_pieces(std::move(pieces))) {
    MDLM_CHECK(run.target >= 0 && run.target < 4, "gradient-norm target ", run.target, " is not 0..3");
    Tensor& sum = into[run.target];
    if (!sum.defined()) sum = Tensor::zeros({1}, acc, stream);
    ops::sum_squares(grads.slice_flat(run.offset, {run.count}), sum, stream);
  }
  auto value = [&](int t) {
    return into[t].defined() ? static_cast<double>(into[t].to_floats(stream)[0]) : 0.0;
  };
  return {.split = value(kNormSplit),
          .replicated = value(kNormReplicated),
          .expert_split = value(kNormExpertSplit),
          .expert_replicated = value(kNormExpertReplicated)};
}

double sum_over_ranks(comm::Communicator& c, double v, const Stream& stream) {
  Tensor t = Tensor::from_floats({0.0f}, {1}, DType::F64);
  t.data<double>()[0] = v;
  if (!stream.device().is_cpu()) t = t.to(stream.device(), stream);
  c.all_reduce(t, comm::ReduceOp::Sum, stream);
  c.synchronize(stream);
  return t.to(Device::cpu(), stream).data<double>()[0];
}

}  // namespace megadlm
