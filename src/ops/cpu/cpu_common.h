// Internal helpers shared by the CPU reference ops: the f32/f64 switch and access to auxiliary
// float tensors (statistics, losses, loss weights, main grads) that the CPU backend accepts in f32
// or in the activation's dtype (f64 gradient checks keep full precision end to end).
#pragma once
#include <cstdint>
#include "megadlm/core/error.h"
#include "megadlm/core/tensor.h"

namespace megadlm::ops::cpu::detail {

/// Calls fn(T{}) with T = double for f64 tensors and T = float for f32 ones.
template <typename Fn>
void with_float_type(const char* op, const Tensor& t, Fn&& fn) {
  if (t.dtype() == DType::F64) {
    fn(double{});
  } else {
    MDLM_CHECK(t.dtype() == DType::F32, op, ": CPU tensors must be f32 or f64, got ", t.str());
    fn(float{});
  }
}

/// Element access to an f32 or f64 host tensor, read and written as double.
class FloatAccess {
 public:
  FloatAccess(const char* op, const Tensor& t, const char* what) {
    MDLM_CHECK(t.defined(), op, ": ", what, " is undefined");
    MDLM_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": CPU ", what,
               " must be f32 or f64, got ", t.str());
    f64_ = t.dtype() == DType::F64;
    ptr_ = t.data_ptr();
  }
  double get(int64_t i) const {
    return f64_ ? static_cast<const double*>(ptr_)[i]
                : static_cast<double>(static_cast<const float*>(ptr_)[i]);
  }
  void set(int64_t i, double v) const {
    if (f64_) static_cast<double*>(ptr_)[i] = v;
    else static_cast<float*>(ptr_)[i] = static_cast<float>(v);
  }
  /// += v, rounded once to the storage type.
  void add(int64_t i, double v) const { set(i, get(i) + v); }

 private:
  void* ptr_ = nullptr;
  bool f64_ = false;
};

}  // namespace megadlm::ops::cpu::detail
