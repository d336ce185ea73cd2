// model/saved_activations.h: walks the record structs of model/ (LayerRecord, SelfAttention::
// Saved, Mlp::Saved, NormRecord, ModelRecord); a new saved field must be added here too.
#include "megadlm/model/saved_activations.h"
#include <set>

namespace megadlm {

namespace {

class Counter {
 public:
  explicit Counter(DType activation) : activation_(activation) {}
  void activation(const Tensor& t) { add(t, dtype_size(activation_)); }
  void statistic(const Tensor& t) { add(t, 4); }
  /// A linear's kept input: the rows, or FP8 codes (one byte an element on CUDA, decoded f32 on
  /// the CPU) with their scales.
  void linear_input(const tp::LinearInput& in) {
    activation(in.x);
    for (const Tensor* t : {&in.codes.data, &in.codes.data_t, &in.codes.scale_inv, &in.codes.scale_inv_t})
      if (t->defined()) add(*t, dtype_size(t->dtype()));
  }
  void norm(const NormRecord& r) {
    activation(r.x);
    statistic(r.mean);
    statistic(r.rstd);
  }
  int64_t take() {
    const int64_t b = bytes_;
    bytes_ = 0;
    return b;
  }

 private:
  void add(const Tensor& t, size_t element_bytes) {
    if (!t.defined() || t.numel() == 0) return;
    if (!seen_.insert(t.data_ptr()).second) return;  // a storage shared by two fields
    bytes_ += t.numel() * static_cast<int64_t>(element_bytes);
  }
  DType activation_;
  std::set<const void*> seen_;
  int64_t bytes_ = 0;
};

}  // namespace

SavedActivationBytes saved_activation_bytes(const ModelRecord& rec, DType activation_dtype) {
  Counter c(activation_dtype);
  for (const LayerRecord& l : rec.layers) {
    c.activation(l.x_in);
    c.norm(l.norm1);
    const SelfAttention::Saved& a = l.attention;
    c.linear_input(a.x_full);
    c.norm(a.q_norm);
    c.norm(a.k_norm);
    for (const Tensor* t : {&a.q, &a.k, &a.v, &a.qkv, &a.out, &a.cp.q, &a.cp.k, &a.cp.v})
      c.activation(*t);
    c.statistic(a.qk_rstd);
    c.statistic(a.lse);
    c.statistic(a.cp.lse);
    c.activation(l.x_mid);
    c.norm(l.norm2);
    c.linear_input(l.mlp.x_full);
    c.activation(l.mlp.fc1_out);
    c.activation(l.mlp.act_out);
  }
  for (const Tensor& t : rec.unit_inputs) c.activation(t);
  SavedActivationBytes out;
  out.layers = c.take();
  c.norm(rec.final_norm);
  c.activation(rec.final_out);
  c.activation(rec.dlogits);
  c.activation(rec.dfinal);
  c.activation(rec.logits);
  c.statistic(rec.losses);
  out.head = c.take();
  return out;
}

}  // namespace megadlm
