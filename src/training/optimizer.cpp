#include "megadlm/training/optimizer.h"
#include <algorithm>
#include "megadlm/ops/optimizer.h"

namespace megadlm {

AdamWOptimizer::AdamWOptimizer(ParameterStore& store, std::vector<OwnedRange> owned,
                               const OptimizerConfig& config, const Stream& stream)
    : store_(store), owned_(std::move(owned)), cfg_(config) {
  for (const OwnedRange& r : owned_) {
    MDLM_CHECK(r.begin <= r.end && r.end <= store.flat_size(), "owned range [", r.begin, ", ",
               r.end, ") outside the flat buffer");
    compact_size_ = std::max(compact_size_, r.compact_offset + (r.end - r.begin));
  }
  const DType state = store.param_dtype() == DType::F64 ? DType::F64 : DType::F32;
  master_ = Tensor::zeros({std::max<int64_t>(compact_size_, 1)}, state, stream);
  exp_avg_ = Tensor::zeros({std::max<int64_t>(compact_size_, 1)}, state, stream);
  exp_avg_sq_ = Tensor::zeros({std::max<int64_t>(compact_size_, 1)}, state, stream);
  for (const OwnedRange& r : owned_) {
    if (r.end == r.begin) continue;
    Tensor m = master_.slice_flat(r.compact_offset, {r.end - r.begin});
    store.fill_initial_values(m, r.begin, stream);
  }
}

void AdamWOptimizer::step(const Tensor& grads, double lr, const Stream& stream) {
  MDLM_CHECK(grads.numel() >= compact_size_, "optimizer gradients have ", grads.numel(),
             " elements, the owned ranges need ", compact_size_);
  ++steps_;
  Tensor params = store_.flat_params();
  for (const OwnedRange& r : owned_) {
    for (const ParamDesc& d : store_.descs()) {
      const int64_t s = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
      if (s >= e) continue;
      ops::AdamWArgs a;
      a.lr = static_cast<float>(lr);
      a.beta1 = cfg_.adam_beta1;
      a.beta2 = cfg_.adam_beta2;
      a.eps = cfg_.adam_eps;
      a.weight_decay = d.weight_decay ? cfg_.weight_decay : 0.0f;
      a.step = steps_;
      const int64_t c = r.compact_offset + (s - r.begin);
      Tensor master = master_.slice_flat(c, {e - s});
      Tensor g = grads.slice_flat(c, {e - s});
      Tensor m = exp_avg_.slice_flat(c, {e - s});
      Tensor v = exp_avg_sq_.slice_flat(c, {e - s});
      Tensor model = params.slice_flat(s, {e - s});
      ops::adamw_step(master, g, m, v, model, a, stream);
    }
  }
}

}  // namespace megadlm
