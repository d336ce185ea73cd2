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

}  // namespace megadlm::ops
