// The scalar FP8 conversions, shared by the host reference (fp8.cpp) and the CUDA kernels so that
// both round every value the same way, bit for bit. Float arithmetic only: the quantum of a
// value's binade is a power of two, so a · (1 / quantum) is exact and rintf (round to nearest,
// ties to even, the default rounding mode on host and device) does the one rounding.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MDLM_FP8_HD __host__ __device__ __forceinline__
#else
#define MDLM_FP8_HD inline
#endif

namespace megadlm::ops::fp8_math {

struct Format {
  int exponent_bits;
  int mantissa_bits;
  int bias;
  float max_finite;
  uint8_t max_code;  ///< magnitude bits of max_finite
};

// e4m3: S.1111.111 is NaN, so the largest finite is S.1111.110 = 1.75 · 2^8 = 448.
// e5m2: exponent 11111 is inf/NaN, so the largest finite is S.11110.11 = 1.75 · 2^15 = 57344.
MDLM_FP8_HD Format e4m3() { return {4, 3, 7, 448.0f, 0x7E}; }
MDLM_FP8_HD Format e5m2() { return {5, 2, 15, 57344.0f, 0x7B}; }

MDLM_FP8_HD uint32_t float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}
MDLM_FP8_HD float bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}
/// 2^k for a normal float's exponent (-126 <= k <= 127), from its bits: what ldexpf(1, k) gives,
/// without the library call (on the host the quantizers spent more time in ldexpf than anywhere).
MDLM_FP8_HD float pow2(int k) { return bits_float(static_cast<uint32_t>(127 + k) << 23); }

MDLM_FP8_HD uint8_t encode(float x, Format f) {
  const uint32_t bits = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7F;  // NaN
  const float a = fabsf(x);
  // Everything from max_finite up rounds to max_finite or beyond: saturate (inf included).
  if (a >= f.max_finite) return static_cast<uint8_t>(sign | f.max_code);
  const int emin = 1 - f.bias;                 // exponent of the smallest normal
  int e = static_cast<int>((bits >> 23) & 0xFFu) - 127;  // binade of a (fp32 subnormals: -127)
  if (e < emin) e = emin;                      // FP8 subnormals share the smallest normal's quantum
  // a / quantum, the quantum 2^(e - M) a normal float in both formats: a multiplication by its
  // inverse, a power of two too, is the same exact value (checked on all 2^32 floats).
  const float n = rintf(a * pow2(f.mantissa_bits - e));  // 0 … 2^(M+1)
  const int steps = static_cast<int>(n);
  if (steps == 0) return sign;
  const int one = 1 << f.mantissa_bits;
  if (e == emin && steps < one) return static_cast<uint8_t>(sign | steps);  // subnormal
  int exponent = e, mantissa = steps;
  if (mantissa == 2 * one) {  // rounded up into the next binade
    exponent += 1;
    mantissa = one;
  }
  const int code = ((exponent + f.bias) << f.mantissa_bits) | (mantissa - one);
  return static_cast<uint8_t>(sign | code);
}

MDLM_FP8_HD float decode(uint8_t code, Format f) {
  const bool negative = (code & 0x80u) != 0;
  const int magnitude = code & 0x7F;
  const int exponent = magnitude >> f.mantissa_bits;
  const int mantissa = magnitude & ((1 << f.mantissa_bits) - 1);
  const int top = (1 << f.exponent_bits) - 1;
  float v;
  if (f.exponent_bits == 4 && magnitude == 0x7F) {
    v = bits_float(0x7FC00000u);  // e4m3 NaN
  } else if (f.exponent_bits == 5 && exponent == top) {
    v = mantissa == 0 ? bits_float(0x7F800000u) : bits_float(0x7FC00000u);
  } else if (exponent == 0) {
    v = static_cast<float>(mantissa) * pow2(1 - f.bias - f.mantissa_bits);
  } else {
    v = static_cast<float>((1 << f.mantissa_bits) + mantissa) * pow2(exponent - f.bias - f.mantissa_bits);
  }
  return negative ? -v : v;
}

/// The current scale of an amax, fp8_current_scale of include/megadlm/ops/fp8.h without the
/// epsilon (the rule the blockwise kernels apply per tile, bit for bit the host's): an amax that
/// is 0, infinite or NaN gives 1; an fp32 overflow of max_value / amax gives FLT_MAX; power_of_2
/// clears the mantissa bits (rounds down).
MDLM_FP8_HD float current_scale(float amax, float max_value, bool power_of_2) {
  const uint32_t bits = float_bits(amax);
  if (!(amax > 0.0f) || (bits & 0x7FFFFFFFu) >= 0x7F800000u) return 1.0f;
#if defined(__CUDA_ARCH__)
  float s = __fdiv_rn(max_value, amax);
#else
  float s = max_value / amax;
#endif
  if ((float_bits(s) & 0x7FFFFFFFu) == 0x7F800000u) s = bits_float(0x7F7FFFFFu);  // FLT_MAX
  if (power_of_2) s = bits_float(float_bits(s) & 0xFF800000u);
  return s;
}

/// 1 / s, rounded to nearest (the dequantization factor a scale grid holds).
MDLM_FP8_HD float reciprocal(float s) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, s);
#else
  return 1.0f / s;
#endif
}

}  // namespace megadlm::ops::fp8_math
