// Internal: the one switch from a device-neutral op to its backend, plus shared argument checks.
// Backends may assume what these checks guarantee (same device, expected dtypes and shapes).
#pragma once
#include <initializer_list>
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

// The only #if on the CUDA build flag in ops/: without the CUDA backend a CUDA tensor reaching an
// op is reported instead of failing to link.
#if MEGADLM_WITH_CUDA
#define MDLM_CUDA_BACKEND(call) call
#else
#define MDLM_CUDA_BACKEND(call) ::megadlm::ops::detail::no_cuda_backend(#call)
#endif

namespace megadlm::ops::detail {

[[noreturn]] inline void no_cuda_backend(const char* call) {
  MDLM_FAIL(call, ": this libmegadlm was built without the CUDA backend; use --device cpu");
}

/// Every defined tensor is on the stream's device.
inline void check_device(const char* op, const Stream& stream,
                         std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    MDLM_CHECK(t->device() == stream.device(), op, ": tensor ", t->str(), " is not on the stream's device ",
               stream.device().str());
  }
}

inline void check_numel(const char* op, const Tensor& t, int64_t n, const char* what) {
  MDLM_CHECK(t.defined() && t.numel() == n, op, ": ", what, " must have ", n, " elements, got ",
             t.defined() ? t.str() : std::string("undefined"));
}

inline void check_dtype(const char* op, const Tensor& t, DType d, const char* what) {
  MDLM_CHECK(t.dtype() == d, op, ": ", what, " must be ", dtype_name(d), ", got ", t.str());
}

/// A GEMM's separate addend (C = alpha AB + beta * addend): C's [m, n] shape and dtype.
inline void check_addend(const char* op, const Tensor& addend, const Tensor& c, int64_t m, int64_t n) {
  MDLM_CHECK(addend.rows() == m && addend.cols() == n && addend.dtype() == c.dtype(), op, ": addend ",
             addend.str(), " must have C's shape and dtype ", c.str());
}

/// Auxiliary floats next to an activation (norm statistics, losses, loss weights): f32, and on
/// CPU also the activation's own dtype, so that f64 gradient checks stay f64 end to end.
inline void check_aux_float(const char* op, const Tensor& t, const Tensor& activation,
                            const char* what) {
  if (t.is_cpu() && t.dtype() == activation.dtype()) return;
  check_dtype(op, t, DType::F32, what);
}

/// The activation dtype of a backend: f32 or f64 on CPU, bf16 (or f32) on CUDA.
inline void check_float_activation(const char* op, const Tensor& t, const char* what) {
  if (t.is_cpu()) {
    MDLM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": CPU ", what,
               " must be f32 or f64, got ", t.str());
  } else {
    MDLM_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F32, op, ": CUDA ", what,
               " must be bf16 or f32, got ", t.str());
  }
}

}  // namespace megadlm::ops::detail
