// Optimizer steps on CUDA: AdamW on flat fp32 buffers exactly as optimizer.h writes it (bias
// correction, decoupled weight decay), optionally writing the updated master into the bf16 (or
// f32) model parameter in the same pass. Entry -> launch_flat (common.cuh) -> AdamWOp.
// One read of master/grad/m/v and one write of master/m/v(/param) per element, 16-byte accesses
// when every pointer allows it. The bias corrections 1 - beta^step are computed once on the host
// (in double, then rounded to fp32); all per-element math is fp32 with IEEE sqrt and division.
#include <cmath>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

/// P: model parameter storage type; kWriteParam: whether there is one to write.
template <typename P, bool kWriteParam>
struct AdamWOp {
  float* master;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  P* param;
  float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2;

  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float p[N], g[N], m[N], v[N];
    load_vec<N>(master + i, p);
    load_vec<N>(grad + i, g);
    load_vec<N>(exp_avg + i, m);
    load_vec<N>(exp_avg_sq + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      m[k] = beta1 * m[k] + (1.0f - beta1) * g[k];
      v[k] = beta2 * v[k] + (1.0f - beta2) * g[k] * g[k];
      const float mhat = m[k] / bias_correction1;
      const float vhat = v[k] / bias_correction2;
      p[k] = p[k] - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p[k]);
    }
    store_vec<N>(master + i, p);
    store_vec<N>(exp_avg + i, m);
    store_vec<N>(exp_avg_sq + i, v);
    if constexpr (kWriteParam) store_vec<N>(param + i, p);
  }
};

template <typename P, bool kWriteParam>
void launch_adamw(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                  Tensor& model_param, const AdamWArgs& args, cudaStream_t stream) {
  constexpr int kVec = 4;  // float4 for the fp32 buffers
  AdamWOp<P, kWriteParam> op{};
  op.master = master.data<float>();
  op.grad = grad.data<float>();
  op.exp_avg = exp_avg.data<float>();
  op.exp_avg_sq = exp_avg_sq.data<float>();
  op.param = kWriteParam ? static_cast<P*>(model_param.data_ptr()) : nullptr;
  op.lr = args.lr;
  op.beta1 = args.beta1;
  op.beta2 = args.beta2;
  op.eps = args.eps;
  op.weight_decay = args.weight_decay;
  const double step = static_cast<double>(args.step);
  op.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(args.beta1), step));
  op.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(args.beta2), step));
  const bool vectorizable = is_aligned(op.master, 16) && is_aligned(op.grad, 16) &&
                            is_aligned(op.exp_avg, 16) && is_aligned(op.exp_avg_sq, 16) &&
                            (!kWriteParam || is_aligned(op.param, sizeof(P) * kVec));
  launch_flat<kVec>(master.numel(), vectorizable, op, stream);
}

}  // namespace

void adamw_step(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& model_param, const AdamWArgs& args, const Stream& stream) {
  NvtxRange range("adamw_step");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  if (!model_param.defined()) {
    launch_adamw<float, false>(master, grad, exp_avg, exp_avg_sq, model_param, args, s);
    return;
  }
  dispatch_activation_dtype(model_param.dtype(), "adamw_step model_param", [&](auto tag) {
    using P = typename decltype(tag)::type;
    launch_adamw<P, true>(master, grad, exp_avg, exp_avg_sq, model_param, args, s);
  });
}

}  // namespace megadlm::ops::cuda
