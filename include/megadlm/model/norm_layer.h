// A RMSNorm or LayerNorm with its parameters in the store (weight, and bias for LayerNorm).
#pragma once
#include <string>
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/model/transformer_config.h"

namespace megadlm {

struct NormRecord {
  Tensor x, mean, rstd;  ///< input and statistics saved for backward
};

class NormLayer {
 public:
  NormLayer() = default;
  /// Registers `prefix`.weight (ones) and, for LayerNorm, `prefix`.bias (zeros); `width` is the
  /// normalised dimension.
  /// `tp`: replicated over the TP group; `tp.partial_grad` when each rank sees only part of the
  /// rows or heads (sequence parallelism, QK-layernorm), so gradients are summed over TP.
  NormLayer(NormType type, float eps, const std::string& prefix, int64_t width,
            ParameterStore& store, TpSlice tp = {});

  /// x [R, width] -> y, saving x and statistics into rec.
  Tensor forward(const Tensor& x, NormRecord& rec, const Stream& stream) const;
  /// dy -> dx; adds weight (and bias) gradients; clears rec.
  Tensor backward(const Tensor& dy, NormRecord& rec, const Stream& stream) const;

  /// The residual add fused with the norm: sum = x + residual (the new residual stream, written
  /// to `sum`), returns norm(sum); rec as forward(sum). One pass for RMSNorm
  /// (ops::add_rms_norm_forward), add then forward for LayerNorm.
  Tensor forward_add(const Tensor& x, const Tensor& residual, Tensor& sum, NormRecord& rec,
                     const Stream& stream) const;
  /// backward(dy) + dresidual in one pass for RMSNorm (ops::rms_norm_backward_add).
  Tensor backward_add(const Tensor& dy, const Tensor& dresidual, NormRecord& rec,
                      const Stream& stream) const;

  NormType type() const { return type_; }
  float eps() const { return eps_; }
  /// The weight and its fp32 main grad (for ops that fuse the norm into another pass).
  Tensor weight() const { return store_->param(weight_); }
  Tensor weight_grad() const { return store_->grad(weight_); }

 private:
  NormType type_ = NormType::RMSNorm;
  float eps_ = 1e-5f;
  ParameterStore* store_ = nullptr;
  ParameterStore::Handle weight_ = -1, bias_ = -1;
};

}  // namespace megadlm
