// The FP8 scaling state (include/megadlm/parallel/fp8_state.h).
#include "megadlm/parallel/fp8_state.h"
#include "megadlm/core/error.h"
#include "megadlm/ops/elementwise.h"
#include <algorithm>

namespace megadlm {

bool Fp8State::fp8_layer(int layer) const {
  return layer >= settings_.bf16_start && layer < settings_.num_layers - settings_.bf16_end;
}

int Fp8State::add(const std::string& name, Role role) {
  MDLM_CHECK(!amax_.defined(), "Fp8State::add(", name, ") after the buffers were allocated");
  names_.push_back(name);
  roles_.push_back(role);
  host_.emplace_back(settings_.history_len);
  return size() - 1;
}

ops::Fp8Type Fp8State::type(int i) const {
  return roles_[static_cast<size_t>(i)] == Role::GradOutput ? settings_.grad_type : settings_.fwd_type;
}

void Fp8State::ensure_buffers(const Stream& stream) {
  if (amax_.defined()) return;
  const int64_t n = std::max(1, size());
  amax_ = Tensor::zeros({n, 1}, DType::F32, stream);
  scale_ = Tensor::zeros({n, 1}, DType::F32, stream);
  upload_scales(stream);
}

void Fp8State::upload_scales(const Stream& stream) {
  std::vector<float> s(static_cast<size_t>(std::max(1, size())), 1.0f);
  for (size_t i = 0; i < host_.size(); ++i) s[i] = host_[i].scale;
  Tensor host = Tensor::from_floats(s, {static_cast<int64_t>(s.size()), 1});
  copy_tensor(host, scale_, stream);
}

Tensor Fp8State::amax(int i, const Stream& stream) {
  ensure_buffers(stream);
  return amax_.narrow(i, 1);
}

Tensor Fp8State::scale(int i, const Stream& stream) {
  ensure_buffers(stream);
  return scale_.narrow(i, 1);
}

void Fp8State::add_gathered_weight(int slot, int first, int last) {
  MDLM_CHECK(settings_.param_gather, "Fp8State::add_gathered_weight without --fp8-param-gather");
  MDLM_CHECK(!blockwise(), "--fp8-param-gather with --fp8-recipe blockwise is not built (FP8-7)");
  MDLM_CHECK(!have_gathered_, "Fp8State::add_gathered_weight(", name(slot), ") after a gather");
  MDLM_CHECK(roles_[static_cast<size_t>(slot)] == Role::Weight, name(slot), " is not a weight");
  gathered_.push_back({.slot = slot, .first = first, .last = last, .codes = {}});
}

const ops::Fp8Tensor* Fp8State::gathered_codes(int slot) const {
  if (!have_gathered_) return nullptr;
  for (const GatheredWeight& g : gathered_)
    if (g.slot == slot) return &g.codes;
  return nullptr;
}

void Fp8State::gathered(Tensor weight_amax) {
  have_gathered_ = true;
  gathered_amax_ = std::move(weight_amax);
}

void Fp8State::begin_step(const Stream& stream) {
  ensure_buffers(stream);
  ops::fill(amax_, 0.0f, stream);
  if (have_gathered_ && delayed() && gathered_amax_.defined()) {
    // --fp8-param-gather: this step's weight casts were the shard casts of the last gather.
    for (size_t k = 0; k < gathered_.size(); ++k) {
      Tensor dst = amax_.narrow(gathered_[k].slot, 1);
      copy_tensor(gathered_amax_.slice_flat(static_cast<int64_t>(k), {1, 1}), dst, stream);
    }
  }
  ++generation_;  // weights are cast afresh at their first use in the step (and only then)
}

void Fp8State::finish_step(comm::Communicator* tp, comm::Communicator* grad_group, const Stream& stream) {
  if (!delayed() || size() == 0) return;
  ensure_buffers(stream);
  for (comm::Communicator* g : {tp, grad_group})
    if (g != nullptr && g->size() > 1) g->all_reduce(amax_, comm::ReduceOp::Max, stream);
  const std::vector<float> amax = amax_.to_floats(stream);
  for (size_t i = 0; i < host_.size(); ++i) {
    ops::fp8_record_amax(host_[i], amax[i]);
    ops::fp8_delayed_update(host_[i], type(static_cast<int>(i)), settings_.margin, settings_.algo);
  }
  upload_scales(stream);
  ops::fill(amax_, 0.0f, stream);
}

std::vector<float> Fp8State::state(int i) const {
  const ops::Fp8ScalingState& h = host_[static_cast<size_t>(i)];
  std::vector<float> v = h.amax_history;
  v.push_back(h.scale);
  return v;
}

void Fp8State::set_state(int i, const std::vector<float>& values, const Stream& stream) {
  ops::Fp8ScalingState& h = host_[static_cast<size_t>(i)];
  MDLM_CHECK(values.size() == h.amax_history.size() + 1, "FP8 state of ", name(i), ": ", values.size(),
             " values for an amax history of ", h.amax_history.size(), " (+ the scale); was the "
             "checkpoint saved with another --fp8-amax-history-len?");
  for (size_t k = 0; k < h.amax_history.size(); ++k) h.amax_history[k] = values[k];
  h.scale = values.back();
  ensure_buffers(stream);
  upload_scales(stream);
}

}  // namespace megadlm
