// CPU reference GEMM: C = alpha * op(A) * op(B) + beta * C (or the addend) (+ bias), row-major,
// single-threaded.
// A transposed operand is first copied to a contiguous row-major op(X), so that one i-k-j kernel
// (inner loop contiguous over N, a row of C accumulated in double) serves all four transpose
// combinations. Dtypes: A, B f32 or f64; C and bias A's dtype or f32. Not a BLAS: correctness and
// predictable O(M*N*K) cost for small models are its job.
#include <algorithm>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {

namespace {

/// Row-major [rows, cols] copy of the transpose of x, which is [cols, rows].
template <typename T>
std::vector<T> transpose_copy(const T* x, int64_t rows, int64_t cols) {
  std::vector<T> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < cols; ++r)
    for (int64_t c = 0; c < rows; ++c) t[static_cast<size_t>(c * cols + r)] = x[r * rows + c];
  return t;
}

// Rows of C computed together, so that each row of op(B) is loaded once per block rather than
// once per row of C (B is the large operand: a weight matrix or a batch of activations).
constexpr int64_t kRowBlock = 4;

/// c[m, n] = alpha * a[m, k] * b[k, n] + beta * c_in + bias, all contiguous row-major (c_in is
/// c, or the addend).
template <typename T, typename TC>
void gemm_nn(const T* a, const T* b, TC* c, const TC* c_in, const TC* bias, int64_t m, int64_t n,
             int64_t k, double alpha, double beta) {
  std::vector<double> acc(static_cast<size_t>(kRowBlock * n));
  for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m - i0);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t kk = 0; kk < k; ++kk) {
      const T* brow = b + kk * n;
      for (int64_t r = 0; r < rows; ++r) {
        const double aik = static_cast<double>(a[(i0 + r) * k + kk]);
        double* arow = acc.data() + r * n;
        for (int64_t j = 0; j < n; ++j) arow[j] += aik * static_cast<double>(brow[j]);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      TC* crow = c + (i0 + r) * n;
      const TC* in_row = c_in + (i0 + r) * n;
      const double* arow = acc.data() + r * n;
      for (int64_t j = 0; j < n; ++j) {
        double v = alpha * arow[j];
        // beta == 0 writes C without reading it: uninitialised memory (or NaN) must not leak in.
        if (beta != 0.0) v += beta * static_cast<double>(in_row[j]);
        if (bias != nullptr) v += static_cast<double>(bias[j]);
        crow[j] = static_cast<TC>(v);
      }
    }
  }
}

template <typename T, typename TC>
void gemm_typed(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  const int64_t m = c.rows(), n = c.cols();
  const int64_t k = args.trans_a ? a.rows() : a.cols();
  std::vector<T> at, bt;
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  if (args.trans_a) {  // A is [K, M]
    at = transpose_copy(pa, m, k);
    pa = at.data();
  }
  if (args.trans_b) {  // B is [N, K]
    bt = transpose_copy(pb, k, n);
    pb = bt.data();
  }
  const TC* bias = args.bias != nullptr ? args.bias->data<TC>() : nullptr;
  const TC* c_in = args.addend != nullptr ? args.addend->data<TC>() : c.data<TC>();
  gemm_nn<T, TC>(pa, pb, c.data<TC>(), c_in, bias, m, n, k, static_cast<double>(args.alpha),
                 static_cast<double>(args.beta));
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, const Stream& stream) {
  if (a.dtype() == DType::F64 && c.dtype() == DType::F64) {
    gemm_typed<double, double>(a, b, c, args);
  } else if (a.dtype() == DType::F64 && c.dtype() == DType::F32) {
    gemm_typed<double, float>(a, b, c, args);
  } else {
    MDLM_CHECK(a.dtype() == DType::F32 && c.dtype() == DType::F32,
               "gemm: CPU A, B and C must be f32 or f64 (C may be f32), got A ", a.str(), ", C ",
               c.str());
    gemm_typed<float, float>(a, b, c, args);
  }
}

}  // namespace megadlm::ops::cpu
