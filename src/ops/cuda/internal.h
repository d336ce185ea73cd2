// Internal launchers that one CUDA op family lends another, and the NVTX range every CUDA entry
// opens. Plain C++ (no device code), so host-only sources such as gemm.cpp can include it.
#pragma once
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <cstdint>
#include "megadlm/core/tensor.h"

namespace megadlm::ops::cuda {

/// Names the op in Nsight timelines for the lifetime of the object.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

/// dst[c] += sum_{p < num_partials} partials[p * cols + c], summed in increasing p (fixed order,
/// so the second stage of every two-stage reduction is deterministic). reduce.cu.
void launch_add_partial_rows(const float* partials, int64_t num_partials, int64_t cols, float* dst,
                             cudaStream_t stream);

/// c[r, :] += bias[:] for c [rows, cols] of bf16 or f32 and bias of c's dtype. elementwise.cu.
void launch_add_row_bias(Tensor& c, const Tensor& bias, cudaStream_t stream);

}  // namespace megadlm::ops::cuda
