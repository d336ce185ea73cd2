#include "megadlm/core/side_stream.h"

namespace megadlm {

const Stream* SideStream::for_compute(const Stream& compute) {
  if (!compute.is_cuda()) return nullptr;
  if (!stream_ || stream_->device() != compute.device()) stream_ = Stream::create(compute.device());
  return &*stream_;
}

}  // namespace megadlm
