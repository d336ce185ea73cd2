// Optimizer steps on CUDA: AdamW on flat fp32 buffers exactly as optimizer.h writes it (bias
// correction, decoupled weight decay), optionally writing the updated master into the bf16 (or
// f32) model parameter in the same pass. Entry -> launch_flat (common.cuh) -> AdamWOp.
// One read of master/grad/m/v and one write of master/m/v(/param) per element, 16-byte accesses
// when every pointer allows it. The bias corrections 1 - beta^step are computed once on the host
// (in double, then rounded to fp32); all per-element math is fp32 with IEEE sqrt and division.
// The gradient is multiplied by args.grad_scale as it is read (the clip coefficient), rounded
// exactly as scale_inplace rounds it, so folding the clip in changes no bit of the step.
// adamw_step_multi runs the same AdamWOp over many parameters in one launch: a block owns a tile
// of the concatenated index space, finds its parameter in a small device table, and takes the
// 16-byte path when the tile lies inside one aligned parameter (nearly always), single elements
// across parameter boundaries. Same element code, so bitwise the same as one launch each.
#include <cmath>
#include <vector>
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
  float grad_scale;  // the gradient read is __fmul_rn(g, grad_scale): never fused into an FMA

  template <int N>
  __device__ __forceinline__ void apply(int64_t i) const {
    float p[N], g[N], m[N], v[N];
    load_vec<N>(master + i, p);
    load_vec<N>(grad + i, g);
    load_vec<N>(exp_avg + i, m);
    load_vec<N>(exp_avg_sq + i, v);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      g[k] = __fmul_rn(g[k], grad_scale);  // bitwise ScaleOp's g * s (scale_inplace)
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
  op.grad_scale = args.grad_scale;
  const double step = static_cast<double>(args.step);
  op.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(args.beta1), step));
  op.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(args.beta2), step));
  const bool vectorizable = is_aligned(op.master, 16) && is_aligned(op.grad, 16) &&
                            is_aligned(op.exp_avg, 16) && is_aligned(op.exp_avg_sq, 16) &&
                            (!kWriteParam || is_aligned(op.param, sizeof(P) * kVec));
  launch_flat<kVec>(master.numel(), vectorizable, op, stream);
}

/// A parameter of adamw_step_multi in the concatenated index space [begin, end).
struct MultiSegment {
  int64_t begin, end, state_offset, param_offset, decay;
};

constexpr int kMultiVec = 4;
constexpr int64_t kMultiTile = int64_t{kFlatThreads} * kMultiVec * 4;  // elements per block

template <typename P, bool kWriteParam>
__device__ __forceinline__ AdamWOp<P, kWriteParam> op_for(const AdamWOp<P, kWriteParam>& base,
                                                           const MultiSegment& s, float wd) {
  AdamWOp<P, kWriteParam> op = base;
  op.master += s.state_offset;
  op.grad += s.state_offset;
  op.exp_avg += s.state_offset;
  op.exp_avg_sq += s.state_offset;
  if constexpr (kWriteParam) op.param += s.param_offset;
  op.weight_decay = s.decay ? wd : 0.0f;
  return op;
}

template <typename P, bool kWriteParam>
__global__ void __launch_bounds__(kFlatThreads)
adamw_multi_kernel(AdamWOp<P, kWriteParam> base, const MultiSegment* __restrict__ segs, int n_segs,
                   int64_t total, bool vectorizable) {
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * kMultiTile;
  const int64_t v1 = v0 + kMultiTile < total ? v0 + kMultiTile : total;
  int lo = 0, hi = n_segs - 1;  // the last segment with begin <= v0
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (segs[mid].begin <= v0) lo = mid;
    else hi = mid - 1;
  }
  int seg = lo;
  const float wd = base.weight_decay;
  const MultiSegment first = segs[seg];
  const int64_t local0 = v0 - first.begin;
  if (vectorizable && v1 <= first.end && (first.state_offset + local0) % kMultiVec == 0 &&
      (first.param_offset + local0) % kMultiVec == 0) {
    const AdamWOp<P, kWriteParam> op = op_for(base, first, wd);
    for (int64_t v = v0 + threadIdx.x * kMultiVec; v < v1; v += int64_t{kFlatThreads} * kMultiVec) {
      if (v + kMultiVec <= v1) {
        op.template apply<kMultiVec>(v - first.begin);
      } else {
        for (int64_t e = v; e < v1; ++e) op.template apply<1>(e - first.begin);
      }
    }
    return;
  }
  for (int64_t v = v0 + threadIdx.x; v < v1; v += kFlatThreads) {
    while (v >= segs[seg].end) ++seg;
    const MultiSegment s = segs[seg];
    op_for(base, s, wd).template apply<1>(v - s.begin);
  }
}

template <typename P, bool kWriteParam>
void launch_adamw_multi(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                        Tensor& model_param, const std::vector<AdamWSegment>& segments,
                        const AdamWArgs& args, const Stream& stream) {
  std::vector<MultiSegment> table;
  int64_t total = 0;
  for (const AdamWSegment& s : segments) {
    if (s.numel == 0) continue;
    table.push_back({total, total + s.numel, s.state_offset, s.param_offset, s.decay ? 1 : 0});
    total += s.numel;
  }
  if (total == 0) return;
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
  op.grad_scale = args.grad_scale;
  const double step = static_cast<double>(args.step);
  op.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(args.beta1), step));
  op.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(args.beta2), step));
  const bool vectorizable = is_aligned(op.master, 16) && is_aligned(op.grad, 16) &&
                            is_aligned(op.exp_avg, 16) && is_aligned(op.exp_avg_sq, 16) &&
                            (!kWriteParam || is_aligned(op.param, sizeof(P) * kMultiVec));
  // The table (a few KB) goes up with the call: the copy from pageable memory is staged before
  // cudaMemcpyAsync returns, and the kernel after it on the same stream reads it.
  Tensor dev = Tensor::empty({static_cast<int64_t>(table.size()) * 5}, DType::I64, stream);
  Tensor host = Tensor::wrap(table.data(), dev.shape(), DType::I64, Device::cpu());
  copy_tensor(host, dev, stream);
  const unsigned grid = static_cast<unsigned>((total + kMultiTile - 1) / kMultiTile);
  adamw_multi_kernel<P, kWriteParam><<<grid, kFlatThreads, 0, megadlm::detail::native_stream(stream)>>>(
      op, static_cast<const MultiSegment*>(dev.data_ptr()), static_cast<int>(table.size()), total,
      vectorizable);
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_step_multi(Tensor& master, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                      Tensor& model_param, const std::vector<AdamWSegment>& segments,
                      const AdamWArgs& args, const Stream& stream) {
  NvtxRange range("adamw_step_multi");
  if (!model_param.defined()) {
    launch_adamw_multi<float, false>(master, grad, exp_avg, exp_avg_sq, model_param, segments, args, stream);
    return;
  }
  dispatch_activation_dtype(model_param.dtype(), "adamw_step_multi model_param", [&](auto tag) {
    using P = typename decltype(tag)::type;
    launch_adamw_multi<P, true>(master, grad, exp_avg, exp_avg_sq, model_param, segments, args, stream);
  });
}

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
