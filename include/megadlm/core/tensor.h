// Tensor: a dtype, a device, a row-major contiguous shape and shared storage.
//
// Deliberately minimal: every tensor is contiguous (views are a byte offset plus a shape), so
// kernels never handle strides. Slicing is along dimension 0 only (narrow), which is what the
// model needs (micro-batches, parameter slices of a flat buffer). Storage is freed when the last
// tensor referring to it goes away; CUDA storage returns to the stream-ordered pool on the
// stream it was allocated on.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/core/device.h"
#include "megadlm/core/dtype.h"
#include "megadlm/core/error.h"

namespace megadlm {

class Stream;

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

/// Bytes of host (CPU) tensor storage alive now, as allocated (rounded up to 64-byte lines);
/// named in the error when a host allocation fails.
int64_t host_bytes_in_use();

/// Owns one allocation (host or device).
class Storage {
 public:
  Storage(void* ptr, size_t bytes, Device device, std::shared_ptr<void> releaser);
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* ptr_;
  size_t bytes_;
  Device device_;
  std::shared_ptr<void> releaser_;  // frees ptr_ when the last reference goes away
};

class Tensor {
 public:
  Tensor() = default;

  /// Uninitialised tensor. CUDA memory comes from the stream-ordered pool on `stream`
  /// (which must be a CUDA stream of the same device); CPU memory is 64-byte aligned.
  static Tensor empty(const Shape& shape, DType dtype, const Stream& stream);
  static Tensor zeros(const Shape& shape, DType dtype, const Stream& stream);
  /// Host tensor holding a copy of `values` (dtype F32, or converted to `dtype`).
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::F32);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape);
  /// Wraps memory owned elsewhere (no ownership taken).
  static Tensor wrap(void* ptr, const Shape& shape, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  bool is_cpu() const { return device_.is_cpu(); }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  /// Size of dimension d; negative d counts from the end.
  int64_t size(int d) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  /// Product of all dimensions but the last (the "rows" of a 2-D view).
  int64_t rows() const {
    int64_t r = 1;
    for (int d = 0; d + 1 < dim(); ++d) r *= shape_[static_cast<size_t>(d)];
    return r;
  }
  int64_t cols() const { return dim() == 0 ? 1 : shape_.back(); }

  void* data_ptr() const;
  template <typename T>
  T* data() const {
    MDLM_CHECK(dtype_ == dtype_of<T>(), "tensor has dtype ", dtype_name(dtype_), ", accessed as ",
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_ptr());
  }

  /// Same storage, new shape with the same number of elements.
  Tensor view(const Shape& shape) const;
  /// Rows [start, start+length) along dimension 0 (shares storage).
  Tensor narrow(int64_t start, int64_t length) const;
  /// A flat [numel] slice [offset, offset+count) of the elements, reshaped to `shape`.
  Tensor slice_flat(int64_t offset, const Shape& shape) const;

  /// Copy to another device and/or dtype, queued on `stream` (host copies are synchronous).
  Tensor to(Device device, DType dtype, const Stream& stream) const;
  Tensor to(Device device, const Stream& stream) const { return to(device, dtype_, stream); }
  /// Host copy converted to float (synchronises the stream); for tests and logging.
  std::vector<float> to_floats(const Stream& stream) const;
  std::vector<int32_t> to_ints(const Stream& stream) const;

  std::string str() const;  ///< "bf16[4, 8] cuda:0"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  Device device_;
};

/// Copies src into dst (same shape; any devices; dtype converted), queued on `stream`.
/// For host<->device copies `stream` must be the CUDA stream. Defined in core.
void copy_tensor(const Tensor& src, Tensor& dst, const Stream& stream);

}  // namespace megadlm
