#include "megadlm/model/norm_layer.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/norm.h"

namespace megadlm {

NormLayer::NormLayer(NormType type, float eps, const std::string& prefix, int64_t width,
                     ParameterStore& store, TpSlice tp)
    : type_(type), eps_(eps), store_(&store) {
  tp.split = TpSplit::Replicated;
  weight_ = store.add(prefix + ".weight", {width},
                      {.init = {InitKind::Ones, 0.0f}, .weight_decay = false, .tp = tp});
  if (type == NormType::LayerNorm)
    bias_ = store.add(prefix + ".bias", {width},
                      {.init = {InitKind::Zeros, 0.0f}, .weight_decay = false, .tp = tp});
}

Tensor NormLayer::forward(const Tensor& x, NormRecord& rec, const Stream& stream) const {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), stream);
  rec.x = x;
  // f64 statistics only for an f64 model (CPU gradient checks).
  const DType stat = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  rec.rstd = Tensor::empty({x.rows()}, stat, stream);
  if (type_ == NormType::RMSNorm) {
    ops::rms_norm_forward(x, store_->param(weight_), y, rec.rstd, eps_, stream);
  } else {
    rec.mean = Tensor::empty({x.rows()}, stat, stream);
    ops::layer_norm_forward(x, store_->param(weight_), store_->param(bias_), y, rec.mean, rec.rstd,
                            eps_, stream);
  }
  return y;
}

Tensor NormLayer::backward(const Tensor& dy, NormRecord& rec, const Stream& stream) const {
  Tensor dx = Tensor::empty(rec.x.shape(), rec.x.dtype(), stream);
  Tensor dw = store_->grad(weight_);
  if (type_ == NormType::RMSNorm) {
    ops::rms_norm_backward(dy, rec.x, store_->param(weight_), rec.rstd, dx, dw, stream);
  } else {
    Tensor db = store_->grad(bias_);
    ops::layer_norm_backward(dy, rec.x, store_->param(weight_), rec.mean, rec.rstd, dx, dw, db,
                             stream);
  }
  rec = NormRecord{};
  return dx;
}

Tensor NormLayer::forward_add(const Tensor& x, const Tensor& residual, Tensor& sum, NormRecord& rec,
                              const Stream& stream) const {
  if (type_ != NormType::RMSNorm) {
    ops::add(x, residual, sum, stream);
    return forward(sum, rec, stream);
  }
  Tensor y = Tensor::empty(x.shape(), x.dtype(), stream);
  rec.x = sum;
  rec.rstd = Tensor::empty({x.rows()}, x.dtype() == DType::F64 ? DType::F64 : DType::F32, stream);
  ops::add_rms_norm_forward(x, residual, store_->param(weight_), sum, y, rec.rstd, eps_, stream);
  return y;
}

Tensor NormLayer::backward_add(const Tensor& dy, const Tensor& dresidual, NormRecord& rec,
                               const Stream& stream) const {
  if (type_ != NormType::RMSNorm) {
    Tensor dx = backward(dy, rec, stream);
    ops::add(dx, dresidual, dx, stream);
    return dx;
  }
  Tensor dx = Tensor::empty(rec.x.shape(), rec.x.dtype(), stream);
  Tensor dw = store_->grad(weight_);
  ops::rms_norm_backward_add(dy, rec.x, store_->param(weight_), rec.rstd, dresidual, dx, dw, stream);
  rec = NormRecord{};
  return dx;
}

}  // namespace megadlm
