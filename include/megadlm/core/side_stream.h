// A second stream beside the compute stream, on which transfers overlap compute: the context-
// parallel ring's K/V exchange and the tensor-parallel overlap's all-gather and reduce-scatter
// rings each share one among every layer of a model (parallel/model_parallel.h). The callers
// order it against the compute stream with events; this file only owns the stream.
#pragma once
#include <optional>
#include "megadlm/core/stream.h"

namespace megadlm {

/// The transfer stream for work queued on a compute stream: created on first use on the
/// compute stream's device (again if that device changes). None for the CPU, whose transfers
/// block.
class SideStream {
 public:
  /// The transfer stream for work on `compute`, or null (CPU).
  const Stream* for_compute(const Stream& compute);

 private:
  std::optional<Stream> stream_;
};

}  // namespace megadlm
