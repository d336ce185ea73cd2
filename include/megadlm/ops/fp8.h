// FP8 numerics on the host: the two OCP FP8 formats (e4m3, e5m2) encoded and decoded exactly,
// per-tensor scale computation (delayed scaling with an amax history, current "tensorwise"
// scaling), and quantization of fp32 data with a scale. This is the reference every FP8 kernel
// is compared with; it does not own FP8 tensors or GEMMs. docs/fp8.md explains the formats, the
// scale conventions and the rules below.
#pragma once
#include <cstdint>
#include <span>
#include <vector>
#include "megadlm/ops/fp8_type.h"

namespace megadlm::ops {

/// Largest finite value: 448 (e4m3) or 57344 (e5m2).
float fp8_max(Fp8Type type);

/// The value of an FP8 code (every one of the 256 codes: ±0, subnormals, normals, e5m2's ±inf,
/// NaN as a quiet float NaN).
float fp8_decode(uint8_t code, Fp8Type type);

/// The FP8 code nearest to x: round to nearest, ties to even; magnitudes beyond the largest
/// finite value, infinities included, saturate to ±max (what a "satfinite" conversion does);
/// NaN gives 0x7F (the canonical NaN code of both formats, sign dropped); values below half the
/// smallest subnormal give a zero of x's sign.
uint8_t fp8_encode(float x, Fp8Type type);

/// Current (tensorwise) scaling: the quantization multiplier s = fp8_max / amax, so that
/// x·s covers the format's range. amax is first raised to `amax_epsilon`; an amax that is 0,
/// infinite or NaN gives 1; a ratio that overflows fp32 gives FLT_MAX; `power_of_2` rounds s
/// down to a power of two (its mantissa bits cleared, so amax·s ≤ fp8_max still holds).
float fp8_current_scale(float amax, float fp8_max_value, bool power_of_2 = false,
                        float amax_epsilon = 0.0f);

/// Delayed scaling from an amax already chosen from the history: s = (fp8_max / amax) / 2^margin.
/// An amax that is 0, infinite or NaN keeps `previous_scale`; an overflow gives FLT_MAX.
float fp8_delayed_scale(float amax, float fp8_max_value, int margin, float previous_scale);

/// Which amax of the history a delayed scale is computed from (--fp8-amax-compute-algo).
enum class AmaxComputeAlgo { MostRecent, Max };

/// The delayed-scaling state of one tensor: its amax history and its current scale.
///
/// The history is a ring of `len` slots; slot 0 collects the amaxes of the running step
/// (fp8_record_amax keeps their maximum, so several micro-batches share one slot).
/// fp8_delayed_update, once per step after the amaxes are final (and reduced over the ranks
/// that share the scale):
///   1. amax = slot 0 (MostRecent) or the maximum of all slots (Max);
///   2. scale = fp8_delayed_scale(amax, fp8_max, margin, scale);
///   3. the ring turns one slot left (slot i takes slot i+1, the last slot takes slot 0) and
///      slot 0 is cleared: the oldest amax is dropped and the newest sits in the last slot.
/// So the scale used in step n comes from amaxes of steps up to n-1. Worked example, len 3,
/// Max, margin 0, e4m3: amaxes 2, 8, 4 in steps 0..2 give scales 224, 56, 56; after step 2 the
/// ring holds {0, 8, 4}, so an amax of 1 in step 3 still gives 56 (8 is two steps old) and step
/// 4's amax 1 gives 112 (the 8 has left the ring).
struct Fp8ScalingState {
  std::vector<float> amax_history;  ///< [len], slot 0 = the running step
  float scale = 1.0f;               ///< quantization multiplier; dequantize with 1 / scale

  explicit Fp8ScalingState(int len = 1) : amax_history(static_cast<size_t>(len), 0.0f) {}
  float scale_inv() const { return 1.0f / scale; }
};

/// Slot 0 = max(slot 0, amax): a quantization's amax for the running step.
void fp8_record_amax(Fp8ScalingState& state, float amax);

/// The end-of-step update above; returns the new scale.
float fp8_delayed_update(Fp8ScalingState& state, Fp8Type type, int margin, AmaxComputeAlgo algo);

/// max |x_i| over x (NaNs ignored; 0 for an empty span).
float fp8_amax(std::span<const float> x);

/// out[i] = fp8_encode(x[i] · scale) with the product rounded to fp32 first; returns max |x_i|
/// (the amax of the input, for the scale of a later step). out has x's size.
float fp8_quantize(std::span<const float> x, float scale, Fp8Type type, std::span<uint8_t> out);

/// out[i] = fp8_decode(codes[i]) · scale_inv.
void fp8_dequantize(std::span<const uint8_t> codes, float scale_inv, Fp8Type type,
                    std::span<float> out);

/// The CPU emulation of an FP8 GEMM in cuBLASLt's "TN" layout, the only one Hopper runs:
///   d[n·M + m] = alpha · scale_inv_a · scale_inv_b · Σ_k decode(a[m·K + k]) · decode(b[n·K + k])
/// a: [M, K] codes (K contiguous), b: [N, K] codes, d: fp32 [N, M] (cuBLAS's column-major M×N
/// output; for a linear y = x·wᵀ, a = w [out, in], b = x [tokens, in], d = y [tokens, out]).
/// Each product of two FP8 values is exact in fp32; the sum runs in double and is rounded to fp32
/// once at the end, so the emulation is the exact result of the quantized operands up to one
/// rounding. (The device GEMM accumulates in fp32 in its own order: compare with a bound.)
void fp8_gemm_reference(std::span<const uint8_t> a, Fp8Type type_a, float scale_inv_a,
                        std::span<const uint8_t> b, Fp8Type type_b, float scale_inv_b,
                        int64_t m, int64_t n, int64_t k, float alpha, std::span<float> d);

/// Quantizes `x` [rows, cols] (row-major) with `scale` into `out` [cols, rows]: the transposed
/// codes a weight-gradient GEMM needs in the TN layout. Returns max |x|.
float fp8_quantize_transpose(std::span<const float> x, int64_t rows, int64_t cols, float scale,
                             Fp8Type type, std::span<uint8_t> out);

// ------------------------------------------------------------------- blockwise scaling
// DeepSeek-V3's recipe (--fp8-recipe blockwise; docs/fp8.md "Blockwise scaling"): one fp32 scale
// per 1 x 128 tile (Fp8Granularity::Tile1x128) or 128 x 128 block (Block128x128) of an operand
// stored [rows][k] (k contiguous: the GEMM's K dimension), each the current scale of the tile's
// own amax: s = fp8_current_scale(amax_tile, fp8_max, power_of_2). The grid holds the
// dequantization factors 1 / s in cuBLASLt's layout (docs/fp8.md "Scale-grid layout"), KB = ceil(k / 128),
// RB = ceil(rows / 128), pad4(n) = n rounded up to a multiple of 4:
//   Tile1x128    (VEC128_32F):     scale_inv of (row r, K-block kb)       at kb · pad4(rows) + r
//   Block128x128 (BLK128x128_32F): scale_inv of (row-block rb, K-block kb) at rb · pad4(KB) + kb
// The padding entries are 0. A last tile or block that is partial (k or rows not a multiple of
// 128) takes the amax of the elements it has; the GEMMs themselves need k % 128 == 0.

inline int64_t fp8_pad4(int64_t n) { return (n + 3) / 4 * 4; }

/// Number of floats in the scale grid of a [rows, k] operand (0 for Fp8Granularity::Tensor: 1).
int64_t fp8_block_grid_size(Fp8Granularity g, int64_t rows, int64_t k);

/// Index in that grid of the scale covering element (r, c) (c along k).
int64_t fp8_block_grid_index(Fp8Granularity g, int64_t rows, int64_t k, int64_t r, int64_t c);

/// Blockwise quantization of x [rows, k] (k contiguous): codes[i] = encode(x[i] · s_tile) (the
/// product rounded to fp32 first), scale_inv[grid index] = 1 / s_tile, padding 0. g is
/// Tile1x128 or Block128x128. codes has x's size, scale_inv fp8_block_grid_size floats.
void fp8_quantize_blockwise(std::span<const float> x, int64_t rows, int64_t k, Fp8Granularity g,
                            Fp8Type type, bool power_of_2, std::span<uint8_t> codes,
                            std::span<float> scale_inv);

/// The CPU emulation of a block-scaled cuBLASLt GEMM, TN layout as fp8_gemm_reference:
///   d[n·M + m] = alpha · Σ_kb sa(m, kb) · sb(n, kb) · Σ_{k in K-block kb} a[m, k] · b[n, k]
/// a [M, K] codes with the grid scale_inv_a of granularity ga, b [N, K] likewise (each operand's
/// own grid: Tile1x128 or Block128x128, not both Block128x128: cuBLASLt has no 2D x 2D mode).
/// K % 128 == 0. Sums in double, one rounding to fp32 at the end.
void fp8_block_gemm_reference(std::span<const uint8_t> a, Fp8Type type_a, Fp8Granularity ga,
                              std::span<const float> scale_inv_a, std::span<const uint8_t> b,
                              Fp8Type type_b, Fp8Granularity gb, std::span<const float> scale_inv_b,
                              int64_t m, int64_t n, int64_t k, float alpha, std::span<float> d);

}  // namespace megadlm::ops
