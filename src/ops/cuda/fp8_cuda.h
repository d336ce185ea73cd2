// Internal: the CUDA FP8 kernels and the cuBLASLt FP8 GEMM, on raw device buffers of FP8 codes
// (megadlm has no FP8 tensor dtype yet; docs/fp8.md). They round exactly as the host reference of
// include/megadlm/ops/fp8.h (both use ops/fp8_math.h), which the parity tests check bit for bit.
// Built only with CUDA; callers guard on MEGADLM_WITH_CUDA.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/ops/fp8_type.h"

namespace megadlm::ops::cuda {

/// One pass over x (f32 or bf16, contiguous, on the stream's device; [rows, cols] = its 2-D
/// view): codes[i] = encode(x[i] · *scale) when `codes` is not null, and, when `codes_t` is not
/// null, the transposed codes codes_t[c·rows + r] = encode(x[r, c] · *scale) (the column-wise copy
/// the weight-gradient GEMM reads in the TN layout). *amax is raised to max |x| (NaNs ignored):
/// it accumulates, so zero it before the first call of a step. scale, amax: device floats.
void fp8_quantize(const Tensor& x, const float* scale, Fp8Type type, uint8_t* codes,
                  uint8_t* codes_t, float* amax, const Stream& stream);

/// How many of the 2^32 float bit patterns the kernels' conversion (the device's cvt
/// instruction on sm_89+) encodes differently from fp8_math::encode, the host reference's rule;
/// *first_bad_bits gets the smallest such pattern (0xFFFFFFFF when none). A test entry point.
int64_t fp8_encode_mismatches(Fp8Type type, uint32_t* first_bad_bits, const Stream& stream);

/// cuBLASLt FP8 GEMM in the TN layout with fp32 accumulation:
///   d[n, m] = alpha · (*scale_inv_a) · (*scale_inv_b) · Σ_k a[m, k] · b[n, k]
/// a: [m, k] codes, b: [n, k] codes (device; k contiguous), scale_inv_*: device floats (the
/// dequantization factors), d: [n, m] f32 or bf16 tensor: written, or with beta != 0
/// d = (the product) + beta · c_in, c_in = d itself unless given (then a device buffer of d's
/// type and layout, read only; cuBLASLt's C). e4m3 x e4m3, e4m3 x e5m2 and e5m2 x e4m3; m and k multiples of
/// 16 (FP8 tensor cores). Throws naming the combination when cuBLASLt has no algorithm for it.
/// The algorithm is chosen once per shape, types and pointer alignments, then reused.
///
/// Blockwise scaling (granularity_a / granularity_b not Tensor; both or neither): scale_inv_*
/// point at the operands' scale grids in cuBLASLt's layout (ops/fp8.h: Tile1x128 = VEC128_32F,
/// Block128x128 = BLK128x128_32F, not both 128x128), k % 128 == 0. With `may_refuse`, a
/// combination cuBLASLt has no algorithm for returns false instead of throwing (nothing run).
bool fp8_gemm(const uint8_t* a, Fp8Type type_a, const float* scale_inv_a, const uint8_t* b,
              Fp8Type type_b, const float* scale_inv_b, int64_t m, int64_t n, int64_t k,
              float alpha, Tensor& d, const Stream& stream, float beta = 0.0f,
              Fp8Granularity granularity_a = Fp8Granularity::Tensor,
              Fp8Granularity granularity_b = Fp8Granularity::Tensor, bool may_refuse = false,
              const void* c_in = nullptr);

/// Blockwise quantization of x ([rows, cols], f32 or bf16) into raw buffers, bit for bit the host
/// rule (ops/fp8.h fp8_quantize_blockwise):
///  - Tile1x128: `codes` [rows, cols] with 1x128 tiles along cols and `grid` (VEC128 layout of a
///    [rows, cols] operand), and/or `codes_t` [cols, rows] with 1x128 tiles along rows (128
///    consecutive rows of one column) and `grid_t` (VEC128 layout of a [cols, rows] operand);
///  - Block128x128: one scale per 128x128 block, `codes` + `grid` (BLK128x128 of [rows, cols])
///    and/or the transposed `codes_t` + `grid_t` (BLK128x128 of [cols, rows]), one pass.
/// A null codes pointer skips that orientation (its grid pointer is then ignored). The grids'
/// padding entries are not written (the caller zeroes them).
void fp8_quantize_blockwise(const Tensor& x, Fp8Type type, Fp8Granularity granularity, bool power_of_2,
                            uint8_t* codes, float* grid, uint8_t* codes_t, float* grid_t,
                            const Stream& stream);
/// The Tensor-level entry (fp8_gemm.h ops::fp8_quantize_blockwise): allocates codes and zeroed grids.
Fp8Tensor fp8_quantize_blockwise_tensor(const Tensor& x, Fp8Type type, Fp8Granularity granularity,
                                        bool rowwise, bool columnwise, bool power_of_2,
                                        const Stream& stream);
/// ops::fp8_columnwise after its checks: the transposed codes (and 128x128 grid) of row-wise codes.
Fp8Tensor fp8_columnwise_tensor(const Fp8Tensor& q, const Stream& stream);

// The Tensor-level entry points of include/megadlm/ops/fp8_gemm.h (the dispatch in
// src/ops/fp8_gemm.cpp has checked devices and shapes).

/// *amax = max(*amax, max |x|), x f32 or bf16 (one atomic per block).
void fp8_amax(const Tensor& x, float* amax, const Stream& stream);
/// scale[i] = fp8_current_scale(amax[i], fp8_max) on the device (the host rule of ops/fp8.h).
void fp8_scale_from_amax(const float* amax, float* scale, int64_t n, float fp8_max_value,
                         const Stream& stream);
/// Row-wise codes (and with `columnwise` the transposed codes) in one pass, amax raised when
/// given, scale_inv = 1 / scale on the device. Codes are stored as bytes in i32 tensors.
/// `rowwise` false (with `columnwise`): the transposed codes alone, `data` left undefined.
Fp8Tensor fp8_quantize_tensor(const Tensor& x, const Tensor& scale, Fp8Type type, bool columnwise,
                              Tensor* amax, const Stream& stream, bool rowwise = true);
/// ops::fp8_swiglu_backward in one pass where it runs fused (bf16, rows and f multiples of 64,
/// aligned buffers): dfc1's codes in both orientations and act's column-wise codes; false (and
/// nothing done) elsewhere, for the dispatcher's composition.
bool fp8_swiglu_backward_fused(const Tensor& dact, const Tensor& fc1_out, const Fp8CastTarget& dfc1_target,
                               const Fp8CastTarget& act_target, Fp8Tensor& dfc1, Fp8Tensor& act, const Stream& stream);
/// ops::fp8_gemm on the device: cuBLASLt's TN FP8 GEMM, accumulating into C itself for beta;
/// only a bias or an addend other than C takes one elementwise pass from an fp32 product.
void fp8_gemm_tensor(const Fp8Tensor& a, const Fp8Tensor& b, Tensor& c, const GemmArgs& args,
                     const Stream& stream);

}  // namespace megadlm::ops::cuda
