// Token proposals on CUDA (ops/sampling.h). Entry -> launch_proposals -> proposals_kernel.
//
// One 1024-thread block per queried row. Pass 1: each thread walks tokens tid, tid + 1024, ...,
// combining guidance in f32 (ops/sampling_math.h, no FMA), keeping the row max and the best
// (score, token) in float64; a fixed-order shared-memory tree merges them (larger score wins, the
// smaller token on ties: the CPU reference's first-index rule). Pass 2 (softmax confidence):
// sum of exp(l - max) in float64 by the same tree. Rows are a few hundred per step; float64
// exp/log/pow per token cost ~1 ms per 512 rows of 50k tokens on an H200.
#include <cmath>
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"
#include "ops/sampling_math.h"

namespace megadlm::ops::cuda {
namespace {

// A few hundred rows a step: 1024 threads a row so that the float64 passes keep the SMs busy
// (256 took 142 us a step at 16 x 32 rows of 50k logits, latency-bound).
constexpr int kThreads = 1024;

template <typename T>
__device__ __forceinline__ double logit_at(const T* c, const T* u, int64_t v, float w1, int32_t suppress) {
  if (v == suppress) return -INFINITY;
  const float cv = to_float(c[v]);
  if (u == nullptr) return static_cast<double>(cv);
  return static_cast<double>(detail::cfg_combine(cv, to_float(u[v]), w1));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
proposals_kernel(const T* __restrict__ logits, const T* __restrict__ uncond,
                 const int32_t* __restrict__ keys, int32_t* __restrict__ tokens,
                 double* __restrict__ confidence, int64_t vocab, double temperature, float w1,
                 int32_t suppress, PhiloxKey gumbel, PhiloxKey remask, uint32_t step, bool softmax) {
  __shared__ double s_max[kThreads];
  __shared__ double s_score[kThreads];
  __shared__ int64_t s_index[kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t r = blockIdx.x;
  const T* c = logits + r * vocab;
  const T* u = uncond != nullptr ? uncond + r * vocab : nullptr;
  const uint32_t g = static_cast<uint32_t>(keys[2 * r]), j = static_cast<uint32_t>(keys[2 * r + 1]);

  double m = -INFINITY, best_score = -INFINITY;
  int64_t best = vocab;  // "none yet": loses every tie against a real token
  for (int64_t v = tid; v < vocab; v += kThreads) {
    const double l = logit_at(c, u, v, w1, suppress);
    m = fmax(m, l);
    double score = l;
    if (temperature > 0) {
      const double uni = detail::gumbel_uniform(gumbel, v, j, g, step);
      score = exp(l) / pow(-log(uni), temperature);
    }
    if (score > best_score) {  // v increases: the first maximum of this thread stays
      best_score = score;
      best = v;
    }
  }
  s_max[tid] = m;
  s_score[tid] = best_score;
  s_index[tid] = best;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (tid < half) {
      s_max[tid] = fmax(s_max[tid], s_max[tid + half]);
      const double os = s_score[tid + half];
      const int64_t oi = s_index[tid + half];
      if (os > s_score[tid] || (os == s_score[tid] && oi < s_index[tid])) {
        s_score[tid] = os;
        s_index[tid] = oi;
      }
    }
    __syncthreads();
  }
  const double row_max = s_max[0];
  const int64_t chosen = s_index[0] < vocab ? s_index[0] : 0;
  if (!softmax) {
    if (tid == 0) {
      tokens[r] = static_cast<int32_t>(chosen);
      confidence[r] = detail::remask_uniform(remask, j, g, step);
    }
    return;
  }
  __syncthreads();  // every thread has read s_max[0] / s_index[0] before s_max is reused
  double sum = 0;
  for (int64_t v = tid; v < vocab; v += kThreads) sum += exp(logit_at(c, u, v, w1, suppress) - row_max);
  s_max[tid] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (tid < half) s_max[tid] += s_max[tid + half];
    __syncthreads();
  }
  if (tid == 0) {
    tokens[r] = static_cast<int32_t>(chosen);
    confidence[r] = exp(logit_at(c, u, chosen, w1, suppress) - row_max) / s_max[0];
  }
}

}  // namespace

void sample_proposals(const Tensor& logits, const Tensor& uncond_logits, const Tensor& keys,
                      const ProposalArgs& args, Tensor& tokens, Tensor& confidence,
                      const Stream& stream) {
  NvtxRange range("sample_proposals");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const float w1 = static_cast<float>(static_cast<double>(args.cfg_scale) + 1.0);
  dispatch_activation_dtype(logits.dtype(), "sample_proposals", [&](auto tag) {
    using T = typename decltype(tag)::type;
    proposals_kernel<T><<<static_cast<unsigned>(logits.rows()), kThreads, 0, s>>>(
        static_cast<const T*>(logits.data_ptr()),
        uncond_logits.defined() ? static_cast<const T*>(uncond_logits.data_ptr()) : nullptr, keys.data<int32_t>(),
        tokens.data<int32_t>(), confidence.data<double>(), logits.cols(), args.temperature, w1,
        args.suppress_token, PhiloxKey::make(args.seed, RngPurpose::SamplerGumbel),
        PhiloxKey::make(args.seed, RngPurpose::SamplerRemask), args.step,
        args.confidence == ProposalConfidence::Softmax);
    MDLM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace megadlm::ops::cuda
