// The FP8 storage formats, on their own so that CUDA sources (compiled as C++17, without
// <span>) can name them; the FP8 numerics are in megadlm/ops/fp8.h.
#pragma once
#include <cstdint>

namespace megadlm::ops {

/// An FP8 storage format (1 sign bit).
enum class Fp8Type {
  E4M3,  ///< 4 exponent bits (bias 7), 3 mantissa bits; max 448; no infinities; NaN = S.1111.111
  E5M2,  ///< 5 exponent bits (bias 15), 2 mantissa bits; max 57344; inf = S.11111.00
};

/// What one scale of a quantized tensor covers (docs/fp8.md, "Scales").
///  - Tensor: one fp32 scale for the whole tensor (the delayed and tensorwise recipes).
///  - Tile1x128: one scale per 1 x 128 tile, 128 consecutive elements of a row along the GEMM's
///    K dimension (the blockwise recipe's activations and gradients; cuBLASLt VEC128_32F).
///  - Block128x128: one scale per 128 x 128 block (the blockwise recipe's weights;
///    cuBLASLt BLK128x128_32F).
enum class Fp8Granularity { Tensor, Tile1x128, Block128x128 };

/// The block edge of the blockwise recipe.
inline constexpr int64_t kFp8BlockSize = 128;

}  // namespace megadlm::ops
