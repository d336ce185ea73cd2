#include "megadlm/model/parameter_store.h"
#include "megadlm/core/philox.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/random.h"

namespace megadlm {

namespace {
constexpr int64_t kAlign = 64;  // elements; keeps 16-byte vector loads aligned for any dtype
int64_t align_up(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

ParameterStore::Handle ParameterStore::add(const std::string& name, const Shape& shape,
                                           ParamInit init, bool weight_decay,
                                           bool fuse_with_previous) {
  MDLM_CHECK(!materialized(), "parameter ", name, " added after materialize()");
  for (const ParamDesc& d : descs_) MDLM_CHECK(d.name != name, "duplicate parameter name ", name);
  if (fuse_with_previous) {
    MDLM_CHECK(!descs_.empty(), "parameter ", name, " fused with nothing");
    const ParamDesc& prev = descs_.back();
    MDLM_CHECK(prev.weight_decay == weight_decay && prev.shape.size() == shape.size() &&
                   shape_numel(prev.shape) / prev.shape[0] == shape_numel(shape) / shape[0],
               "parameter ", name, " cannot be fused with ", prev.name,
               ": rows must have the same width and decay setting");
  }
  descs_.push_back(ParamDesc{name, shape, init, weight_decay, fuse_with_previous, 0});
  return static_cast<Handle>(descs_.size() - 1);
}

int64_t ParameterStore::num_parameters() const {
  int64_t n = 0;
  for (const ParamDesc& d : descs_) n += shape_numel(d.shape);
  return n;
}

void ParameterStore::materialize(DType param_dtype, uint64_t seed, const Stream& stream) {
  MDLM_CHECK(!materialized(), "materialize() called twice");
  // Offsets: decayed parameters first, then the rest; fused members follow without padding.
  int64_t offset = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool decay = pass == 0;
    for (ParamDesc& d : descs_) {
      if (d.weight_decay != decay) continue;
      if (!d.fuse_with_previous) offset = align_up(offset);
      d.offset = offset;
      offset += shape_numel(d.shape);
    }
    if (decay) decay_size_ = offset = align_up(offset);
  }
  flat_size_ = align_up(offset);

  master_is_param_ = param_dtype == DType::F32 || param_dtype == DType::F64;
  const DType state = param_dtype == DType::F64 ? DType::F64 : DType::F32;
  master_ = Tensor::zeros({flat_size_}, state, stream);
  params_ = master_is_param_ ? master_ : Tensor::zeros({flat_size_}, param_dtype, stream);
  grads_ = Tensor::zeros({flat_size_}, state, stream);
  exp_avg_ = Tensor::zeros({flat_size_}, state, stream);
  exp_avg_sq_ = Tensor::zeros({flat_size_}, state, stream);

  for (size_t i = 0; i < descs_.size(); ++i) {
    const ParamDesc& d = descs_[i];
    Tensor m = master(static_cast<Handle>(i));
    switch (d.init.kind) {
      case InitKind::Normal: {
        ops::NormalInitArgs a;
        a.seed = seed;
        a.param_id = stable_name_id(d.name.c_str());
        a.std = d.init.std;
        Tensor m2 = m.view({m.rows(), m.cols()});
        ops::fill_normal(m2, a, stream);
        break;
      }
      case InitKind::Ones: ops::fill(m, 1.0f, stream); break;
      case InitKind::Zeros: break;  // already zero
    }
  }
  if (!master_is_param_) ops::copy(master_, params_, stream);
}

Tensor ParameterStore::view(const Tensor& flat, Handle first, Handle last) const {
  MDLM_CHECK(flat.defined(), "parameters used before materialize()");
  MDLM_CHECK(first >= 0 && last >= first && last < static_cast<Handle>(descs_.size()),
             "bad parameter range ", first, "..", last);
  const ParamDesc& a = descs_[static_cast<size_t>(first)];
  if (first == last) return flat.slice_flat(a.offset, a.shape);
  int64_t rows = a.shape[0];
  for (Handle h = first + 1; h <= last; ++h) {
    const ParamDesc& d = descs_[static_cast<size_t>(h)];
    MDLM_CHECK(d.fuse_with_previous, "parameters ", a.name, " .. ", d.name, " are not fused");
    rows += d.shape[0];
  }
  Shape shape = a.shape;
  shape[0] = rows;
  return flat.slice_flat(a.offset, shape);
}

void ParameterStore::zero_grads(const Stream& stream) { ops::fill(grads_, 0.0f, stream); }

}  // namespace megadlm
