// CPU GEMM: C = alpha * op(A) * op(B) + beta * C (or the addend) (+ bias), row-major.
// f32 x f32 -> f32 (what training runs) goes to OpenBLAS's sgemm when the build has it
// (MEGADLM_WITH_OPENBLAS): fp32 accumulation in the library's blocked order, one thread per process
// unless OPENBLAS_NUM_THREADS (or OMP_NUM_THREADS) asks for more — several ranks share the cores.
// Everything else — f64 operands (gradient checks, the reference of the op tests) and a build
// without OpenBLAS — runs the naive loop below: a transposed operand is first copied to a
// contiguous row-major op(X), so that one i-k-j kernel (inner loop contiguous over N, a row of C
// accumulated in double, one rounding at the store) serves all four transpose combinations.
// Dtypes: A, B f32 or f64; C and bias A's dtype or f32.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/cpu_ops.h"
#if MEGADLM_WITH_OPENBLAS
#include <cblas.h>
#endif

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

#if MEGADLM_WITH_OPENBLAS
/// One BLAS thread per process unless the user's environment names a count: the CPU ranks of a
/// job (and ctest -j) already share the machine's cores, and OpenBLAS would otherwise start one
/// thread per core in every rank.
void set_blas_threads_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* asked = std::getenv("OPENBLAS_NUM_THREADS");
    if (asked == nullptr) asked = std::getenv("OMP_NUM_THREADS");
    if (asked == nullptr || *asked == '\0') openblas_set_num_threads(1);
  });
}

// Rows of C per sgemm call. OpenBLAS's kernels sum a row of C in an order that depends on the
// call's shape: measured with 0.3.21 (Haswell kernels), a row computed among 7 or more rows
// differs in the last bits from the same row computed alone (120 of 384 shapes), and a column
// window from the whole (72 of 384). Calls of at most 2 rows gave every row bitwise its value
// alone, for any M, N, K, transposes and column window (840 of 840 shapes): what megadlm's
// bitwise guarantees rest on (a padded batch row equals the row alone, --tp-comm-overlap's row
// chunks equal the whole). tests/unit/ops/test_gemm.cpp checks it on the machine that runs it.
// Cost at [512 x 256] x [256 x 768]: ~4x one whole call, still >10x the naive loop.
constexpr int64_t kBlasRowsPerCall = 2;

/// The f32 product through cblas_sgemm, kBlasRowsPerCall rows of C at a time; the bias added
/// after it (C rounded twice where it has a bias: the sgemm's fp32 sum, then + bias).
void gemm_f32_blas(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args) {
  const int64_t m = c.rows(), n = c.cols();
  const int64_t k = args.trans_a ? a.rows() : a.cols();
  if (m == 0 || n == 0) return;
  constexpr int64_t kMaxDim = std::numeric_limits<blasint>::max();
  MDLM_CHECK(m <= kMaxDim && n <= kMaxDim && k <= kMaxDim, "gemm: CPU dimensions M ", m, ", N ",
             n, ", K ", k, " exceed the BLAS's index type (at most ", kMaxDim, ")");
  set_blas_threads_once();
  float* pc = c.data<float>();
  if (args.beta != 0.0f && args.addend != nullptr && args.addend->data<float>() != pc) {
    std::memmove(pc, args.addend->data<float>(), static_cast<size_t>(m * n) * sizeof(float));
  }
  // Row-major leading dimensions: the stored row length of each operand (at least 1, which
  // BLAS requires even when a dimension is 0). Rows i.. of op(A) start at A + i * lda, or at
  // column i of the stored [K, M] when A is transposed.
  const int64_t lda = std::max<int64_t>(1, args.trans_a ? m : k);
  const int64_t ldb = std::max<int64_t>(1, args.trans_b ? k : n);
  const float* pa = a.data<float>();
  for (int64_t i = 0; i < m; i += kBlasRowsPerCall) {
    const int64_t rows = std::min(kBlasRowsPerCall, m - i);
    // beta == 0: OpenBLAS zero-fills C before accumulating (C is never read, NaN cannot leak).
    cblas_sgemm(CblasRowMajor, args.trans_a ? CblasTrans : CblasNoTrans,
                args.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(rows),
                static_cast<blasint>(n), static_cast<blasint>(k), args.alpha,
                args.trans_a ? pa + i : pa + i * lda, static_cast<blasint>(lda), b.data<float>(),
                static_cast<blasint>(ldb), args.beta, pc + i * n, static_cast<blasint>(n));
  }
  if (args.bias != nullptr) {
    const float* bias = args.bias->data<float>();
    for (int64_t i = 0; i < m; ++i) {
      float* row = pc + i * n;
      for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
    }
  }
}
#endif

}  // namespace

const char* blas_library() {
#if MEGADLM_WITH_OPENBLAS
  static const std::string name = std::string("OpenBLAS (") + openblas_get_config() + ")";
  return name.c_str();
#else
  return "";
#endif
}

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, const Stream& stream) {
  if (a.dtype() == DType::F64 && c.dtype() == DType::F64) {
    gemm_typed<double, double>(a, b, c, args);
  } else if (a.dtype() == DType::F64 && c.dtype() == DType::F32) {
    gemm_typed<double, float>(a, b, c, args);
  } else {
    MDLM_CHECK(a.dtype() == DType::F32 && c.dtype() == DType::F32,
               "gemm: CPU A, B and C must be f32 or f64 (C may be f32), got A ", a.str(), ", C ",
               c.str());
#if MEGADLM_WITH_OPENBLAS
    gemm_f32_blas(a, b, c, args);
#else
    gemm_typed<float, float>(a, b, c, args);
#endif
  }
}

}  // namespace megadlm::ops::cpu
