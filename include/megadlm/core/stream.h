// An ordered queue of device work, passed explicitly to every op (no current-stream global).
// A CPU stream executes immediately. A CUDA stream owns a cudaStream_t plus the per-stream
// resources the CUDA backend needs (cuBLASLt handle and workspace).
#pragma once
#include <memory>
#include "megadlm/core/device.h"

namespace megadlm {

namespace detail {
struct CudaStreamResources;  // defined in src/core/cuda/ (cudaStream_t, cublasLt handle, workspace)
}

class Stream {
 public:
  /// The host stream: ops run synchronously on the calling thread.
  static Stream cpu();
  /// A new non-blocking CUDA stream on `device` with its own cuBLASLt handle and workspace.
  static Stream create(Device device);
  /// The stream for a device: cpu() for the host, create(device) for CUDA.
  static Stream for_device(Device device) { return device.is_cpu() ? cpu() : create(device); }

  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  /// The cudaStream_t as an opaque pointer (nullptr for the CPU stream).
  void* native() const;
  /// Blocks the host until all work queued on the stream has finished.
  void synchronize() const;
  /// Backend resources; only the CUDA backend calls this.
  const std::shared_ptr<detail::CudaStreamResources>& cuda_resources() const { return cuda_; }

 private:
  Device device_ = Device::cpu();
  std::shared_ptr<detail::CudaStreamResources> cuda_;
};

/// Peak bytes held by the stream-ordered pool of `device` since the last reset (0 on CPU).
size_t cuda_peak_memory_bytes(Device device);
/// Peak bytes the pool of `device` has reserved from the driver since the last reset (what it
/// holds, in use or cached for reuse: PyTorch's max_memory_reserved). 0 on CPU.
size_t cuda_peak_reserved_memory_bytes(Device device);
/// Bytes currently held in use by the pool of `device`.
size_t cuda_used_memory_bytes(Device device);
/// Total memory of `device` (0 on CPU and without CUDA).
size_t cuda_total_memory_bytes(Device device);
void cuda_reset_peak_memory(Device device);

}  // namespace megadlm
