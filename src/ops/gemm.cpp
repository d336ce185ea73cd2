// Dispatch for the gemm family (see include/megadlm/ops/gemm.h).
#include "megadlm/ops/gemm.h"
#include <atomic>
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

namespace {
std::atomic<bool> g_batch_invariant{false};
}  // namespace

void set_batch_invariant(bool on) { g_batch_invariant.store(on, std::memory_order_relaxed); }
bool batch_invariant() { return g_batch_invariant.load(std::memory_order_relaxed); }

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, const Stream& stream) {
  detail::check_device("gemm", stream, {&a, &b, &c, args.bias});
  MDLM_CHECK(a.dtype() == b.dtype(), "gemm: A ", a.str(), " and B ", b.str(), " dtypes differ");
  const int64_t m = args.trans_a ? a.cols() : a.rows();
  const int64_t k = args.trans_a ? a.rows() : a.cols();
  const int64_t kb = args.trans_b ? b.cols() : b.rows();
  const int64_t n = args.trans_b ? b.rows() : b.cols();
  MDLM_CHECK(k == kb, "gemm: inner dimensions differ: op(A) ", a.str(), " trans_a=", args.trans_a,
             ", op(B) ", b.str(), " trans_b=", args.trans_b);
  MDLM_CHECK(c.rows() == m && c.cols() == n, "gemm: C ", c.str(), " must be [", m, ", ", n, "]");
  MDLM_CHECK(c.dtype() == a.dtype() || c.dtype() == DType::F32, "gemm: C ", c.str(),
             " must have A's dtype or f32");
  if (args.bias) {
    detail::check_numel("gemm", *args.bias, n, "bias");
    detail::check_dtype("gemm", *args.bias, c.dtype(), "bias");
  }
  if (args.addend) {
    detail::check_device("gemm", stream, {args.addend});
    MDLM_CHECK(args.beta != 0.0f, "gemm: an addend needs beta != 0 (beta 0 writes C = alpha AB)");
    detail::check_addend("gemm", *args.addend, c, m, n);
  }
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(cuda::gemm(a, b, c, args, stream));
  } else {
    cpu::gemm(a, b, c, args, stream);
  }
}

}  // namespace megadlm::ops
