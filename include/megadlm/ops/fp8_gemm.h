// FP8 tensors and the FP8 GEMM on `Tensor`s, for both backends: the ops the FP8 linear layers of
// parallel/tensor_parallel/ call (docs/fp8.md, "Training"). The numerics are those of
// include/megadlm/ops/fp8.h: q = encode(x · scale), rounded to nearest even, saturating.
//
// Backends:
//  - CPU (the reference): an Fp8Tensor's `data` is an f32 tensor of the *decoded, unscaled*
//    codes (every value exactly representable in the FP8 format), so the GEMM is the fp32 GEMM
//    of the decoded operands times alpha · scale_inv_a · scale_inv_b: the products are exact,
//    only the fp32 summation order differs from the device.
//  - CUDA: `data` holds the FP8 codes as bytes (row-wise, K contiguous for the forward GEMM),
//    `data_t` the transposed codes written by the same pass (Hopper FP8 GEMMs are TN-only), and
//    the GEMM is cuBLASLt's with fp32 accumulation (src/ops/cuda/fp8.cu).
// Scales live on the tensors' device as f32 [1] tensors, so a delayed or current scale computed
// on the device needs no host round trip.
#pragma once
#include <cstdint>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/fp8_type.h"
#include "megadlm/ops/gemm.h"

namespace megadlm::ops {

/// A quantized [rows, cols] tensor: codes (backend storage above), its type and scale(s).
///
/// Per-tensor scaling (granularity Tensor): `scale_inv` is f32 [1] and serves both orientations;
/// `data_t` is the transpose of `data` (CUDA only).
/// Blockwise scaling (Tile1x128 / Block128x128, --fp8-recipe blockwise): each orientation has
/// its own codes and scale grid in cuBLASLt's layout (ops/fp8.h, fp8_block_grid_index), on
/// both backends: `data` [rows, cols] with `scale_inv` the grid of a [rows, cols] operand
/// (K = cols), `data_t` [cols, rows] with `scale_inv_t` the grid of a [cols, rows] operand
/// (K = rows). 1x128 tiles of the two orientations cover different elements (a row's 128
/// columns vs a column's 128 rows), so they are quantized separately from x; a 128x128 block is
/// the same block in both, so `data_t` is the transpose of `data` and `scale_inv_t` the
/// transposed grid. Either orientation may be absent when no GEMM reads it.
struct Fp8Tensor {
  Tensor data;         ///< row-wise codes (CPU: f32 decoded values [rows, cols]; CUDA: bytes)
  Tensor data_t;       ///< column-wise codes [cols, rows] (per-tensor: CUDA only, when asked for)
  Tensor scale_inv;    ///< f32 [1] (per-tensor) or the scale grid of `data` (blockwise)
  Tensor scale_inv_t;  ///< blockwise: the scale grid of `data_t`
  Fp8Type type = Fp8Type::E4M3;
  Fp8Granularity granularity = Fp8Granularity::Tensor;
  int64_t rows = 0, cols = 0;
  bool defined() const { return data.defined() || data_t.defined(); }
  bool blockwise() const { return granularity != Fp8Granularity::Tensor; }
};

/// amax[0] = max(amax[0], max |x|) (NaNs ignored). amax: f32 [1] (or a [1]-element view).
void fp8_amax(const Tensor& x, Tensor& amax, const Stream& stream);

/// Current (tensorwise) scaling, elementwise: scale[i] = fp8_current_scale(amax[i], fp8_max).
void fp8_scale_from_amax(const Tensor& amax, Tensor& scale, Fp8Type type, const Stream& stream);

/// Quantizes x ([rows, cols] view, f32 on CPU; bf16 or f32 on CUDA) with the device scalar
/// `scale` in one pass: row-wise codes, and on CUDA with `columnwise` also the transposed codes.
/// When `amax` is given, amax[0] is raised to max |x| in the same pass. `rowwise` false with
/// `columnwise` (CUDA): the transposed codes alone (a weight gradient's operand); the CPU keeps
/// its row-wise values regardless (its emulated GEMM reads them in either orientation).
Fp8Tensor fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Type type, bool columnwise,
                       Tensor* amax, const Stream& stream, bool rowwise = true);

/// Blockwise quantization (--fp8-recipe blockwise) of x ([rows, cols] view; f32 on CPU, bf16 or
/// f32 on CUDA): granularity Tile1x128 (activations, gradients) or Block128x128 (weights),
/// scales from each tile's own amax (ops/fp8.h fp8_quantize_blockwise), power-of-2 when asked.
/// `rowwise`: `data` + `scale_inv` (tiles along cols); `columnwise`: `data_t` + `scale_inv_t`
/// (tiles along rows, stored transposed). No state, no communication.
Fp8Tensor fp8_quantize_blockwise(const Tensor& x, Fp8Type type, Fp8Granularity granularity,
                                 bool rowwise, bool columnwise, bool power_of_2, const Stream& stream);

/// q with its column-wise orientation made from its row-wise codes by transposing them: the
/// codes the quantizer's column-wise pass writes, without a second pass over x. Per-tensor
/// scaling (CUDA: the transposed bytes; the CPU's decoded values serve both orientations and come
/// back as they are) and 128x128 blocks (the transposed codes and scale grid); 1x128 tiles run
/// along one orientation and are refused. `data` and `scale_inv` are shared with q. A weight's
/// cast keeps its row-wise codes through a step and makes the transposed ones only while its
/// data-gradient GEMM runs (parallel/tensor_parallel/layers.cpp).
Fp8Tensor fp8_columnwise(const Fp8Tensor& q, const Stream& stream);
/// C = alpha · op(A) · op(B) (+ beta · C or beta · addend) (+ bias) with A and B dequantized:
/// the GemmArgs contract of ops::gemm (gemm.h), FP8 operands, fp32 accumulation, C f32 or the
/// activation dtype. CUDA needs the layout it can run TN: op(A) from `data` (trans_a false) or
/// `data_t` (trans_a true), op(B) from `data_t` (trans_b false) or `data` (trans_b true); N and K
/// multiples of 16; not both operands e5m2.
/// Blockwise operands (both, one of them Tile1x128, not both Block128x128): op(A) and op(B) are
/// read from the orientation whose tiles run along K, on both backends (op(A) from `data_t`
/// when trans_a, op(B) from `data` when trans_b, as CUDA above); K % 128 == 0. CUDA: cuBLASLt
/// with the VEC128_32F / BLK128x128_32F scale modes; CPU: each operand dequantized per tile
/// (code · its tile's scale_inv) and the fp32 GEMM of the two.
void fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, Tensor& c, const GemmArgs& args,
              const Stream& stream);

/// Where a quantized tensor goes under delayed scaling (the scale known before the values): the
/// state slot's scale and running amax (f32 [1] each, raised by the cast) and the FP8 type.
struct Fp8CastTarget {
  Tensor scale;
  Tensor amax;
  Fp8Type type = Fp8Type::E4M3;
};

/// The SwiGLU MLP's backward with both outputs quantized, per-tensor scaling: from
/// dact [rows, f] and fc1_out [rows, 2f] ([gate | up]), the codes of
///   dfc1 (swiglu_backward of dact; its fc1's output gradient) in both orientations, to `dfc1`,
///   and of act = swiglu(fc1_out) (the forward's output, recomputed: fc2's weight-gradient
///   input) column-wise, to `act`,
/// bit for bit what swiglu_backward_recompute (outputs in dact's dtype) followed by fp8_quantize
/// of each gives, with their amaxes raised the same way: on CUDA (bf16, rows and f multiples of
/// 64) one pass that never writes the bf16 dfc1 and act, else that composition. (The CPU's codes
/// are f32 values, one orientation read either way.)
void fp8_swiglu_backward(const Tensor& dact, const Tensor& fc1_out, const Fp8CastTarget& dfc1_target,
                         const Fp8CastTarget& act_target, Fp8Tensor& dfc1, Fp8Tensor& act, const Stream& stream);

}  // namespace megadlm::ops
