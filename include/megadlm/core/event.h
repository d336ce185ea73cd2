// A point in a stream's work that other streams or the host can wait for (cudaEvent on CUDA;
// on the CPU stream work is already complete when the call returns, so events are no-ops).
#pragma once
#include <memory>
#include "megadlm/core/stream.h"

namespace megadlm {

namespace detail {
struct CudaEventHandle;
}

class Event {
 public:
  /// An event for streams of `device` (timing disabled: cheap).
  static Event create(Device device);
  /// Marks the current end of `stream`'s queue.
  void record(const Stream& stream);
  /// Makes `stream` wait (on the device, not the host) until the recorded point is reached.
  /// For the CPU stream, whose work runs on the host, this blocks the host instead.
  void wait_on(const Stream& stream) const;
  /// True when the recorded work has completed (always true on the CPU).
  bool query() const;
  void synchronize() const;
  Device device() const { return device_; }

 private:
  Device device_ = Device::cpu();
  std::shared_ptr<detail::CudaEventHandle> handle_;
};

}  // namespace megadlm
