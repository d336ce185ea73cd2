// Internal helpers shared by every CUDA source: error checks that name the failing call, the
// per-stream resources, bf16 conversions and launch helpers. Included only from */cuda/ files.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string>
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::detail {

/// Everything one CUDA stream owns. Created by Stream::create, destroyed with the last Stream copy
/// (and the last tensor allocated on it).
struct CudaStreamResources {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  void* workspace = nullptr;  ///< cuBLASLt workspace (see kCublasWorkspaceBytes)
  size_t workspace_bytes = 0;
  ~CudaStreamResources();
};

/// One cudaEvent_t (timing disabled), owned by core/event's Event through a shared handle.
struct CudaEventHandle {
  int device = 0;
  cudaEvent_t event = nullptr;
  ~CudaEventHandle();
};

/// A captured CUDA graph and its instantiation (core/cuda_graph.h), destroyed with the last
/// handle. A launch still in flight then completes: CUDA frees an executing graph afterwards.
struct CudaGraphHandle {
  int device = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~CudaGraphHandle();
};

[[noreturn]] void throw_cuda_error(const char* call, int code, const char* name, const char* msg,
                                   const char* file, int line);

inline cudaStream_t native_stream(const Stream& s) {
  MDLM_CHECK(s.is_cuda(), "a CUDA op was given the CPU stream");
  return s.cuda_resources()->stream;
}

inline unsigned grid_for(int64_t n, int block) {
  return static_cast<unsigned>((n + block - 1) / block);
}

}  // namespace megadlm::detail

/// MDLM_CUDA_CHECK(call): throws with the call's text, CUDA's error name and message, file:line.
#define MDLM_CUDA_CHECK(call)                                                                   \
  do {                                                                                          \
    cudaError_t err_ = (call);                                                                  \
    if (__builtin_expect(err_ != cudaSuccess, 0))                                                       \
      ::megadlm::detail::throw_cuda_error(#call, static_cast<int>(err_), cudaGetErrorName(err_), \
                                          cudaGetErrorString(err_), __FILE__, __LINE__);        \
  } while (0)

/// After every kernel launch, in the launcher: catches bad launch configurations at the op.
#define MDLM_CUDA_CHECK_LAUNCH() MDLM_CUDA_CHECK(cudaGetLastError())

#define MDLM_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                          \
    cublasStatus_t st_ = (call);                                                                \
    if (__builtin_expect(st_ != CUBLAS_STATUS_SUCCESS, 0))                                              \
      ::megadlm::detail::throw_cuda_error(#call, static_cast<int>(st_), "cublasStatus",         \
                                          cublasLtGetStatusString(st_), __FILE__, __LINE__);    \
  } while (0)
