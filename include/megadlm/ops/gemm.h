// Matrix products (cuBLASLt on CUDA, plain loops on CPU).
//
// Shapes: tensors are row-major; a tensor with more than two dimensions is viewed as
// [rows(), cols()]. Accumulation contract (docs/conventions.md): C is *written* when beta == 0
// and *accumulated* (C = alpha*op(A)op(B) + beta*C) otherwise; weight gradients use beta = 1
// into the fp32 main-grad buffer.
#pragma once
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops {

struct GemmArgs {
  bool trans_a = false;  ///< use A^T
  bool trans_b = false;  ///< use B^T
  float alpha = 1.0f;
  float beta = 0.0f;     ///< 1.0f accumulates into C
  const Tensor* bias = nullptr;  ///< optional [N], added to every row of C (dtype of C)
  /// Optional, with beta != 0: C = alpha op(A) op(B) + beta * addend (+ bias), C written (the
  /// sum rounded once, in the GEMM's epilogue: a residual add without its own pass). C's shape
  /// and dtype; may be C itself.
  const Tensor* addend = nullptr;
};

/// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C (+ bias); beta * addend instead of
/// beta * C when args.addend is set.
/// @param[in]  a  [M,K] (or [K,M] with trans_a); CPU: f32/f64; CUDA: bf16 (or f32)
/// @param[in]  b  [K,N] (or [N,K] with trans_b); same dtype as a
/// @param[in,out] c [M,N]; dtype of a, or f32 when a is bf16 (fp32 accumulation target)
/// Stream: queued on `stream`; all tensors on its device.
void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, const Stream& stream);

/// Batch-invariant mode (off by default; generate_difflm --batch-invariant): every row of a
/// product gets the same bits whatever the number of rows M it is computed with, so that a
/// prompt decodes to the same tokens alone and in any batch on CUDA (docs/generation.md,
/// "Batch-invariant mode"). On CUDA, cuBLASLt's algorithm is then chosen once per (N, K,
/// transposes, dtypes, alignments, bias) at a fixed M without split-K reductions, and used for
/// every M; attention takes kernels whose per-row key order does not depend on the batch
/// (src/ops/attention_support.h). CPU: no effect (its rows are batch-invariant already).
/// Process-wide; set it before the first product (algorithms are cached per mode).
void set_batch_invariant(bool on);
bool batch_invariant();

}  // namespace megadlm::ops
