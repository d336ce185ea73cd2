// SwiGLU's per-element arithmetic on the device, shared by the activation kernels
// (activation.cu) and the FP8 fused backward (fp8.cu): one expression, compiled the same way in
// both, so that the fused kernel's values round exactly as the activation kernel's.
// sigmoid uses __expf and __fdividef: ~2 ulp in fp32, far below the bf16 rounding of the output
// (for gate -> -inf, __fdividef(g, inf) is -0, the right limit of silu).
#pragma once

namespace megadlm::ops::cuda::swiglu_math {

__device__ __forceinline__ float sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

/// silu(gate) * up.
__device__ __forceinline__ float value(float g, float u) { return g * sigmoid(g) * u; }

/// dgate = d * up * silu'(gate), dup = d * silu(gate), silu'(g) = s (1 + g (1 - s)).
__device__ __forceinline__ void grad(float g, float u, float d, float& dg, float& du) {
  const float s = sigmoid(g);
  du = d * g * s;
  dg = d * u * s * (1.0f + g * (1.0f - s));
}

}  // namespace megadlm::ops::cuda::swiglu_math
