// Internal: the few CUDA-runtime services core needs, implemented in src/core/cuda/runtime.cpp
// when the CUDA backend is built and by src/core/cuda_bridge_stub.cpp (which throws) otherwise.
// This is the only seam between core and the CUDA runtime.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include "megadlm/core/device.h"
#include "megadlm/core/dtype.h"

namespace megadlm::detail {

struct CudaStreamResources;
struct CudaEventHandle;  // a cudaEvent_t and its device (src/core/cuda/cuda_utils.h)
struct CudaGraphHandle;  // a cudaGraph_t and its instantiation (src/core/cuda/cuda_utils.h)

std::shared_ptr<CudaStreamResources> cuda_create_stream(int device);
void* cuda_stream_native(const CudaStreamResources* res);
void cuda_stream_synchronize(const CudaStreamResources* res);

/// Allocates from the device's stream-ordered pool; the returned releaser frees on the same
/// stream (and keeps the stream alive until then).
void* cuda_malloc_async(size_t bytes, const std::shared_ptr<CudaStreamResources>& res,
                        std::shared_ptr<void>* releaser);
/// Raw byte copy between any two of host/device, ordered on `res` (synchronous to host when the
/// destination is host memory).
void cuda_copy_bytes(const void* src, Device src_device, void* dst, Device dst_device, size_t bytes,
                     const CudaStreamResources* res);
/// Element conversion between floating/integer dtypes on the device.
void cuda_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                  const CudaStreamResources* res);
void cuda_memset_zero(void* ptr, size_t bytes, const CudaStreamResources* res);

/// CUDA graphs (core/cuda_graph.h). capture: runs `work` while `res`'s stream is captured
/// (thread-local mode: an unsafe CUDA call of this thread fails the capture) and instantiates
/// the graph; throws with CUDA's error (or work's exception) after ending the capture, so the
/// stream is usable again. launch: queues the graph on `res`'s stream.
std::shared_ptr<CudaGraphHandle> cuda_graph_capture(const CudaStreamResources* res,
                                                    const std::function<void()>& work);
void cuda_graph_launch(const CudaGraphHandle* graph, const CudaStreamResources* res);
size_t cuda_graph_nodes(const CudaGraphHandle* graph);

/// Makes `device` current for the calling thread (cudaSetDevice).
void cuda_set_device(int device);

/// Events (core/event.h): created without timing, destroyed with the last handle.
std::shared_ptr<CudaEventHandle> cuda_event_create(int device);
void cuda_event_record(CudaEventHandle* ev, const CudaStreamResources* res);
void cuda_event_wait(const CudaEventHandle* ev, const CudaStreamResources* res);
/// True when the recorded work is done; throws on a CUDA error other than "not ready".
bool cuda_event_query(const CudaEventHandle* ev);
void cuda_event_synchronize(const CudaEventHandle* ev);

int cuda_device_count_impl();
size_t cuda_peak_memory(int device);
size_t cuda_peak_reserved_memory(int device);
size_t cuda_used_memory(int device);
size_t cuda_total_memory(int device);  ///< 0 when the device cannot be queried
void cuda_reset_peak(int device);
void cuda_profiler(bool start);

}  // namespace megadlm::detail
