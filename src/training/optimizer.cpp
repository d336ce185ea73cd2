#include "megadlm/training/optimizer.h"
#include <algorithm>
#include "megadlm/ops/optimizer.h"

namespace megadlm {

AdamWOptimizer::AdamWOptimizer(ParameterStore& store, std::vector<OwnedRange> owned,
                               const OptimizerConfig& config, const Stream& stream,
                               OptimizerLayout layout)
    : store_(store), owned_(std::move(owned)), cfg_(config), layout_(std::move(layout)) {
  for (const OwnedRange& r : owned_) {
    MDLM_CHECK(r.begin <= r.end && r.end <= store.flat_size(), "owned range [", r.begin, ", ",
               r.end, ") outside the flat buffer");
    compact_size_ = std::max(compact_size_, r.compact_offset + (r.end - r.begin));
  }
  const DType state = store.param_dtype() == DType::F64 ? DType::F64 : DType::F32;
  MDLM_CHECK(!layout_.alias_master || store.param_dtype() == state,
             "fp32 masters can alias only fp32 (or f64) model weights, not ",
             dtype_name(store.param_dtype()));
  MDLM_CHECK(layout_.model_shards.defined() || store.flat_params().defined(),
             "the optimizer needs the model weights: the store's flat buffer or FSDP's shards");
  MDLM_CHECK(!layout_.model_shards.defined() || layout_.model_shards.numel() >= compact_size_,
             "model shards hold ", layout_.model_shards.numel(), " elements, the owned ranges need ",
             compact_size_);
  const int64_t n = std::max<int64_t>(compact_size_, 1);
  if (!layout_.alias_master) master_ = Tensor::zeros({n}, state, stream);
  exp_avg_ = Tensor::zeros({n}, state, stream);
  exp_avg_sq_ = Tensor::zeros({n}, state, stream);
  if (layout_.alias_master) return;  // the weights were initialised by their owner
  for (const OwnedRange& r : owned_) {
    if (r.end == r.begin) continue;
    Tensor m = master_.slice_flat(r.compact_offset, {r.end - r.begin});
    store.fill_initial_values(m, r.begin, stream);
  }
}

const OwnedRange& AdamWOptimizer::range_of(int64_t compact) const {
  for (const OwnedRange& r : owned_)
    if (compact >= r.compact_offset && compact < r.compact_offset + (r.end - r.begin)) return r;
  MDLM_FAIL("compact element ", compact, " lies in no owned range");
}

Tensor AdamWOptimizer::model_slice(const OwnedRange& r, int64_t compact, int64_t count) const {
  if (layout_.model_shards.defined()) return layout_.model_shards.slice_flat(compact, {count});
  return store_.flat_params().slice_flat(r.begin + (compact - r.compact_offset), {count});
}

Tensor AdamWOptimizer::master_slice(int64_t compact, int64_t count) const {
  if (!layout_.alias_master) return master_.slice_flat(compact, {count});
  const OwnedRange& r = range_of(compact);
  MDLM_CHECK(compact + count <= r.compact_offset + (r.end - r.begin),
             "master slice crosses the end of its owned range");
  return model_slice(r, compact, count);
}

int64_t AdamWOptimizer::state_bytes() const {
  return static_cast<int64_t>((master_.defined() ? master_.nbytes() : 0) + exp_avg_.nbytes() +
                              exp_avg_sq_.nbytes());
}

void AdamWOptimizer::write_model_weights(const Stream& stream) {
  if (layout_.alias_master) return;
  for (const OwnedRange& r : owned_) {
    if (r.end == r.begin) continue;
    Tensor src = master_.slice_flat(r.compact_offset, {r.end - r.begin});
    Tensor dst = model_slice(r, r.compact_offset, r.end - r.begin);
    copy_tensor(src, dst, stream);  // rounds to the model dtype as the optimizer step does
  }
}

void AdamWOptimizer::step(const Tensor& grads, double lr, float grad_scale, const Stream& stream) {
  const int64_t needed = layout_.flat_grads ? store_.flat_size() : compact_size_;
  MDLM_CHECK(grads.numel() >= needed, "optimizer gradients have ", grads.numel(),
             " elements, the owned ranges need ", needed);
  ++steps_;
  if (compact_size_ == 0) return;
  ops::AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = cfg_.adam_beta1;
  a.beta2 = cfg_.adam_beta2;
  a.eps = cfg_.adam_eps;
  a.step = steps_;
  a.grad_scale = grad_scale;
  if (layout_.alias_master || layout_.model_shards.defined() || layout_.flat_grads) {
    // FSDP's layouts (masters that are the weights, weights in FSDP's shards, gradients indexed
    // by flat offset): one adamw_step per owned piece, bitwise what the multi-tensor step gives.
    for (const OwnedRange& r : owned_) {
      for (const ParamDesc& d : store_.descs()) {
        const int64_t s = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
        if (s >= e) continue;
        a.weight_decay = d.weight_decay ? cfg_.weight_decay : 0.0f;
        const int64_t c = r.compact_offset + (s - r.begin);
        Tensor master = master_slice(c, e - s);
        Tensor g = grads.slice_flat(layout_.flat_grads ? s : c, {e - s});
        Tensor m = exp_avg_.slice_flat(c, {e - s});
        Tensor v = exp_avg_sq_.slice_flat(c, {e - s});
        Tensor model = model_slice(r, c, e - s);  // the master itself when it aliases the weights
        ops::adamw_step(master, g, m, v, model, a, stream);
      }
    }
    return;
  }
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
  a.weight_decay = cfg_.weight_decay;
  Tensor g = grads.slice_flat(0, {master_.numel()});
  ops::adamw_step_multi(master_, g, exp_avg_, exp_avg_sq_, params, segments, a, stream);
}

}  // namespace megadlm
