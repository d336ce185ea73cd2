#include "megadlm/core/stream.h"
#include "core/cuda_bridge.h"
#include "megadlm/core/profiler.h"

namespace megadlm {

Stream Stream::cpu() { return Stream(); }

Stream Stream::create(Device device) {
  if (device.is_cpu()) return cpu();
  Stream s;
  s.device_ = device;
  s.cuda_ = detail::cuda_create_stream(device.index);
  return s;
}

void* Stream::native() const { return cuda_ ? detail::cuda_stream_native(cuda_.get()) : nullptr; }

void Stream::synchronize() const {
  if (cuda_) detail::cuda_stream_synchronize(cuda_.get());
}

size_t cuda_peak_memory_bytes(Device device) {
  return device.is_cuda() ? detail::cuda_peak_memory(device.index) : 0;
}
size_t cuda_peak_reserved_memory_bytes(Device device) {
  return device.is_cuda() ? detail::cuda_peak_reserved_memory(device.index) : 0;
}
size_t cuda_used_memory_bytes(Device device) {
  return device.is_cuda() ? detail::cuda_used_memory(device.index) : 0;
}
size_t cuda_total_memory_bytes(Device device) {
  return device.is_cuda() ? detail::cuda_total_memory(device.index) : 0;
}
void cuda_reset_peak_memory(Device device) {
  if (device.is_cuda()) detail::cuda_reset_peak(device.index);
}

void cuda_profiler_range(Device device, bool start) {
  if (device.is_cuda()) detail::cuda_profiler(start);
}

bool cuda_compiled() { return MEGADLM_WITH_CUDA != 0; }
int cuda_device_count() { return detail::cuda_device_count_impl(); }

}  // namespace megadlm
