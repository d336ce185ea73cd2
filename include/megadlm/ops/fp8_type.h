// The FP8 storage formats, on their own so that CUDA sources (compiled as C++17, without
// <span>) can name them; the FP8 numerics are in megadlm/ops/fp8.h.
#pragma once

namespace megadlm::ops {

/// An FP8 storage format (1 sign bit).
enum class Fp8Type {
  E4M3,  ///< 4 exponent bits (bias 7), 3 mantissa bits; max 448; no infinities; NaN = S.1111.111
  E5M2,  ///< 5 exponent bits (bias 15), 2 mantissa bits; max 57344; inf = S.11111.00
};

}  // namespace megadlm::ops
