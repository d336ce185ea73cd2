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
  if (compact_size_ == 0) return;
  Tensor params = store_.flat_params();
  // Every owned piece of every parameter in one launch (multi-tensor AdamW; bitwise the same as
  // one adamw_step per piece): weight decay per parameter, state at the compact offsets.
  std::vector<ops::AdamWSegment> segments;
  for (const OwnedRange& r : owned_) {
    for (const ParamDesc& d : store_.descs()) {
      const int64_t s = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
      if (s >= e) continue;
      segments.push_back({.state_offset = r.compact_offset + (s - r.begin), .param_offset = s,
                          .numel = e - s, .decay = d.weight_decay});
    }
  }
  ops::AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = cfg_.adam_beta1;
  a.beta2 = cfg_.adam_beta2;
  a.eps = cfg_.adam_eps;
  a.weight_decay = cfg_.weight_decay;
  a.step = steps_;
  Tensor g = grads.slice_flat(0, {master_.numel()});
  ops::adamw_step_multi(master_, g, exp_avg_, exp_avg_sq_, params, segments, a, stream);
}

}  // namespace megadlm
