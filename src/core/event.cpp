// core/event.h: a CUDA event through the CUDA bridge (core/cuda_bridge.h); on the CPU every call
// is a no-op because host work is finished when the call that queued it returns.
#include "megadlm/core/event.h"
#include "core/cuda_bridge.h"
#include "megadlm/core/error.h"

namespace megadlm {

Event Event::create(Device device) {
  Event e;
  e.device_ = device;
  if (device.is_cuda()) e.handle_ = detail::cuda_event_create(device.index);
  return e;
}

void Event::record(const Stream& stream) {
  if (device_.is_cpu()) {
    MDLM_CHECK(!stream.is_cuda(), "a CPU event cannot mark a point in the ", stream.device().str(),
               " stream; create the event with Event::create(", stream.device().str(), ")");
    return;
  }
  MDLM_CHECK(stream.device() == device_, "an event of ", device_.str(),
             " cannot be recorded on a stream of ", stream.device().str());
  detail::cuda_event_record(handle_.get(), stream.cuda_resources().get());
}

void Event::wait_on(const Stream& stream) const {
  // A CPU event is already complete; a CPU stream runs on the host, which waits in synchronize().
  if (device_.is_cpu()) return;
  if (!stream.is_cuda()) {
    synchronize();
    return;
  }
  detail::cuda_event_wait(handle_.get(), stream.cuda_resources().get());
}

bool Event::query() const { return device_.is_cpu() || detail::cuda_event_query(handle_.get()); }

void Event::synchronize() const {
  if (device_.is_cuda()) detail::cuda_event_synchronize(handle_.get());
}

}  // namespace megadlm
