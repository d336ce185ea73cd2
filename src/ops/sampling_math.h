// Internal: the per-element arithmetic of ops/sampling.h shared by the CPU reference and the CUDA
// kernel, so both backends draw the same random numbers and combine guidance the same way.
#pragma once
#include <cstdint>
#include "megadlm/core/philox.h"

namespace megadlm::ops::detail {

/// u + f32(w + 1) * (c - u), each operation rounded to f32 (no fused multiply-add, so the CPU
/// and CUDA results and a float32 NumPy reference agree bit for bit).
MDLM_HOST_DEVICE float cfg_combine(float c, float u, float w_plus_one) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(u, __fmul_rn(w_plus_one, __fsub_rn(c, u)));
#else
  volatile float d = c - u;  // volatile: keep the compiler from contracting into an FMA
  volatile float e = w_plus_one * d;
  return u + e;
#endif
}

/// The Gumbel uniform U_v of token v at (generated position j, sample g, step).
MDLM_HOST_DEVICE double gumbel_uniform(PhiloxKey key, int64_t v, uint32_t j, uint32_t g,
                                       uint32_t step) {
  const PhiloxWords w = philox(key, static_cast<uint32_t>(v >> 1), j, g, step);
  return (v & 1) ? uniform53(w.w[2], w.w[3]) : uniform53(w.w[0], w.w[1]);
}

/// The random-remasking confidence of generated position j of sample g at `step`.
MDLM_HOST_DEVICE double remask_uniform(PhiloxKey key, uint32_t j, uint32_t g, uint32_t step) {
  const PhiloxWords w = philox(key, j, 0, g, step);
  return uniform53(w.w[0], w.w[1]);
}

}  // namespace megadlm::ops::detail
