// Internal launchers that one CUDA op family lends another, and the NVTX range every CUDA entry
// opens. Plain C++ (no device code), so host-only sources such as gemm.cpp can include it.
#pragma once
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <cstdint>
#include "megadlm/core/tensor.h"
#include "ops/gemm_algo_key.h"

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

/// Alignment cuBLASLt may assume for a pointer: its largest power-of-two divisor, capped at 256
/// (the heuristic's default assumption; views can be less aligned). gemm.cpp and fp8.cu key their
/// algorithm caches by it and tell the heuristic.
inline uint32_t pointer_alignment(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  const uintptr_t low = v & (~v + 1);
  return static_cast<uint32_t>(low < 256 ? low : 256);
}

/// FNV-1a over 64-bit words: the hash of the GEMM algorithm caches' keys (gemm.cpp, fp8.cu);
/// defined with those keys in ops/gemm_algo_key.h (CPU-testable).
using detail::KeyHasher;

}  // namespace megadlm::ops::cuda
