// Dispatch for the fused QK-norm + RoPE family (include/megadlm/ops/qk_norm_rope.h).
#include "megadlm/ops/qk_norm_rope.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {
namespace {

void check_args(const char* op, const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                const Tensor& positions, const Tensor& rstd, const QkNormRopeArgs& a) {
  MDLM_CHECK(a.heads > 0 && a.kv_heads > 0 && a.head_dim > 0 && a.rotary_dim >= 0 &&
                 a.rotary_dim % 2 == 0 && a.rotary_dim <= a.head_dim,
             op, ": heads ", a.heads, ", kv_heads ", a.kv_heads, ", head_dim ", a.head_dim,
             " and rotary_dim ", a.rotary_dim, " must be positive (rotary_dim even, <= head_dim)");
  detail::check_float_activation(op, qkv, "qkv");
  const int64_t width = (a.heads + 2 * a.kv_heads) * a.head_dim;
  MDLM_CHECK(qkv.dim() == 2 && qkv.cols() == width, op, ": qkv must be [T, ", width,
             "] ((heads + 2 kv_heads) x head_dim), got ", qkv.str());
  detail::check_dtype(op, positions, DType::I32, "positions");
  detail::check_numel(op, positions, qkv.rows(), "positions");
  MDLM_CHECK(q_weight.defined() == k_weight.defined(), op, ": give both norm weights or neither");
  if (q_weight.defined()) {
    for (const Tensor* w : {&q_weight, &k_weight}) {
      detail::check_numel(op, *w, a.head_dim, "norm weight");
      MDLM_CHECK(w->dtype() == qkv.dtype(), op, ": norm weight ", w->str(), " must have qkv's dtype");
    }
    detail::check_numel(op, rstd, qkv.rows() * (a.heads + a.kv_heads), "rstd");
    detail::check_aux_float(op, rstd, qkv, "rstd");
  }
}

}  // namespace

void qk_norm_rope_forward(const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                          const Tensor& positions, Tensor& out, Tensor& rstd,
                          const QkNormRopeArgs& args, const Stream& stream) {
  const char* op = "qk_norm_rope_forward";
  detail::check_device(op, stream, {&qkv, &q_weight, &k_weight, &positions, &out, &rstd});
  check_args(op, qkv, q_weight, k_weight, positions, rstd, args);
  MDLM_CHECK(out.numel() == qkv.numel() && out.dtype() == qkv.dtype(), op, ": out ", out.str(),
             " must match qkv ", qkv.str());
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::qk_norm_rope_forward(qkv, q_weight, k_weight, positions, out, rstd, args, stream));
  else cpu::qk_norm_rope_forward(qkv, q_weight, k_weight, positions, out, rstd, args, stream);
}

void qk_norm_rope_backward(Tensor& dqkv, const Tensor& qkv, const Tensor& q_weight,
                           const Tensor& k_weight, const Tensor& rstd, const Tensor& positions,
                           Tensor& dq_weight, Tensor& dk_weight, const QkNormRopeArgs& args,
                           const Stream& stream) {
  const char* op = "qk_norm_rope_backward";
  detail::check_device(op, stream, {&dqkv, &qkv, &q_weight, &k_weight, &rstd, &positions, &dq_weight, &dk_weight});
  check_args(op, qkv, q_weight, k_weight, positions, rstd, args);
  MDLM_CHECK(dqkv.numel() == qkv.numel() && dqkv.dtype() == qkv.dtype(), op, ": dqkv ", dqkv.str(),
             " must match qkv ", qkv.str());
  if (q_weight.defined()) {
    for (const Tensor* g : {&dq_weight, &dk_weight}) {
      detail::check_numel(op, *g, args.head_dim, "norm weight gradient");
      if (qkv.is_cuda()) detail::check_dtype(op, *g, DType::F32, "norm weight gradient");
    }
  }
  if (stream.is_cuda())
    MDLM_CUDA_BACKEND(cuda::qk_norm_rope_backward(dqkv, qkv, q_weight, k_weight, rstd, positions,
                                                  dq_weight, dk_weight, args, stream));
  else cpu::qk_norm_rope_backward(dqkv, qkv, q_weight, k_weight, rstd, positions, dq_weight,
                                  dk_weight, args, stream);
}

}  // namespace megadlm::ops
