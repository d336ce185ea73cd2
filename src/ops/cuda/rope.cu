// Rotary position embedding on CUDA, in place, rotate-half convention (see rope.h for the
// formula). Entry -> launch_rope -> rope_kernel.
// One thread owns kVec consecutive rotary pairs (i, i + rotary_dim/2) of one token for a group of
// kHeadsPerThread heads: it computes inv_freq, theta = position * inv_freq and sincosf once and
// applies them to every head of its group, so the transcendental work is shared by the heads.
// Angles are fp32 as in rope.h and the CPU reference: inv_freq = 1 / powf(base, 2i / rotary_dim),
// theta = p * inv_freq (fp32 product), then full-range sincosf (no fast-math intrinsics: theta
// reaches thousands of radians).
// Elements past rotary_dim are left untouched. Backward rotates by -theta.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeadsPerThread = 4;

template <typename T, int kVec, bool kBackward>
__global__ void __launch_bounds__(kThreads)
rope_kernel(T* __restrict__ x, const int32_t* __restrict__ positions, int64_t tokens, int heads,
            int head_dim, int rotary_dim, float base) {
  const int half = rotary_dim / 2;
  const int chunks = half / kVec;
  const int groups = (heads + kHeadsPerThread - 1) / kHeadsPerThread;
  const int64_t per_token = static_cast<int64_t>(chunks) * groups;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * per_token) return;
  const int64_t t = idx / per_token;
  const int rem = static_cast<int>(idx - t * per_token);
  const int c = rem % chunks;  // fastest: neighbouring threads touch neighbouring bytes
  const int group = rem / chunks;
  const int i0 = c * kVec;

  const float p = static_cast<float>(positions[t]);
  float cs[kVec], sn[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float inv_freq =
        1.0f / powf(base, static_cast<float>(2 * (i0 + k)) / static_cast<float>(rotary_dim));
    sincosf(p * inv_freq, &sn[k], &cs[k]);
    if (kBackward) sn[k] = -sn[k];
  }

  T* xt = x + t * heads * head_dim;
  // All loads first (raw, to keep registers low): stores to x could otherwise alias later loads
  // in the compiler's view and serialise them.
  Vec<T, kVec> raw1[kHeadsPerThread], raw2[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int h = group * kHeadsPerThread + j;
    if (h < heads) {
      raw1[j] = *reinterpret_cast<const Vec<T, kVec>*>(xt + h * head_dim + i0);
      raw2[j] = *reinterpret_cast<const Vec<T, kVec>*>(xt + h * head_dim + half + i0);
    }
  }
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int h = group * kHeadsPerThread + j;
    if (h >= heads) continue;
    float y1[kVec], y2[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float x1 = to_float(raw1[j].v[k]), x2 = to_float(raw2[j].v[k]);
      y1[k] = x1 * cs[k] - x2 * sn[k];
      y2[k] = x2 * cs[k] + x1 * sn[k];
    }
    store_vec<kVec>(xt + h * head_dim + i0, y1);
    store_vec<kVec>(xt + h * head_dim + half + i0, y2);
  }
}

template <bool kBackward>
void launch_rope(Tensor& x, const Tensor& positions, const RopeArgs& args, const char* op,
                 const Stream& stream) {
  const int64_t tokens = x.numel() / (args.heads * args.head_dim);
  if (tokens == 0) return;
  MDLM_CHECK(args.heads <= INT32_MAX / args.head_dim, op, ": heads * head_dim overflows");
  cudaStream_t s = megadlm::detail::native_stream(stream);
  const int half = static_cast<int>(args.rotary_dim / 2);
  dispatch_activation_dtype(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kVec = kVec16<T>;
    T* px = static_cast<T*>(x.data_ptr());
    const int32_t* pp = positions.data<int32_t>();
    const bool vectorizable = half % kVec == 0 && args.head_dim % kVec == 0 && is_aligned(px, 16);
    const int vec = vectorizable ? kVec : 1;
    const int64_t groups = ceil_div(args.heads, kHeadsPerThread);
    const int64_t threads = tokens * (half / vec) * groups;
    const unsigned grid = static_cast<unsigned>(ceil_div(threads, kThreads));
    if (vectorizable)
      rope_kernel<T, kVec, kBackward><<<grid, kThreads, 0, s>>>(
          px, pp, tokens, static_cast<int>(args.heads), static_cast<int>(args.head_dim),
          static_cast<int>(args.rotary_dim), args.base);
    else
      rope_kernel<T, 1, kBackward><<<grid, kThreads, 0, s>>>(
          px, pp, tokens, static_cast<int>(args.heads), static_cast<int>(args.head_dim),
          static_cast<int>(args.rotary_dim), args.base);
  });
  MDLM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(Tensor& x, const Tensor& positions, const RopeArgs& args, const Stream& stream) {
  NvtxRange range("rope_forward");
  launch_rope<false>(x, positions, args, "rope_forward", stream);
}

void rope_backward(Tensor& dx, const Tensor& positions, const RopeArgs& args, const Stream& stream) {
  NvtxRange range("rope_backward");
  launch_rope<true>(dx, positions, args, "rope_backward", stream);
}

}  // namespace megadlm::ops::cuda
