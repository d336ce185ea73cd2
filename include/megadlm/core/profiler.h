#pragma once
// Brackets for external profilers (Nsight Compute's `--profile-from-start off`, any CUPTI tool).
#include "megadlm/core/device.h"

namespace megadlm {

/// cudaProfilerStart (start) / cudaProfilerStop, after a device synchronisation so that the
/// range holds exactly the work issued inside it. No-op on CPU and without CUDA.
void cuda_profiler_range(Device device, bool start);

}  // namespace megadlm
