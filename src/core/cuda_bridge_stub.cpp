// Stand-ins for the CUDA bridge when libmegadlm is built without CUDA: every entry explains
// that the build lacks the backend (MEGADLM_WITH_CUDA=OFF) instead of failing at link time.
#include "core/cuda_bridge.h"
#include "megadlm/core/error.h"

#if !MEGADLM_WITH_CUDA
namespace megadlm::detail {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  MDLM_FAIL(what, ": this libmegadlm was built without CUDA (configure with -DMEGADLM_WITH_CUDA=ON "
                  "and a CUDA toolkit), use --device cpu");
}
}  // namespace
std::shared_ptr<CudaStreamResources> cuda_create_stream(int) { no_cuda("creating a CUDA stream"); }
void* cuda_stream_native(const CudaStreamResources*) { return nullptr; }
void cuda_stream_synchronize(const CudaStreamResources*) {}
void* cuda_malloc_async(size_t, const std::shared_ptr<CudaStreamResources>&, std::shared_ptr<void>*) {
  no_cuda("allocating CUDA memory");
}
void cuda_copy_bytes(const void*, Device, void*, Device, size_t, const CudaStreamResources*) {
  no_cuda("copying CUDA memory");
}
void cuda_convert(const void*, DType, void*, DType, int64_t, const CudaStreamResources*) {
  no_cuda("converting CUDA tensors");
}
void cuda_memset_zero(void*, size_t, const CudaStreamResources*) { no_cuda("zeroing CUDA memory"); }
void cuda_set_device(int) { no_cuda("selecting a CUDA device"); }
std::shared_ptr<CudaEventHandle> cuda_event_create(int) { no_cuda("creating a CUDA event"); }
void cuda_event_record(CudaEventHandle*, const CudaStreamResources*) { no_cuda("recording a CUDA event"); }
void cuda_event_wait(const CudaEventHandle*, const CudaStreamResources*) {
  no_cuda("waiting on a CUDA event");
}
bool cuda_event_query(const CudaEventHandle*) { no_cuda("querying a CUDA event"); }
void cuda_event_synchronize(const CudaEventHandle*) { no_cuda("synchronizing a CUDA event"); }
std::shared_ptr<CudaGraphHandle> cuda_graph_capture(const CudaStreamResources*, const std::function<void()>&) {
  no_cuda("capturing a CUDA graph");
}
void cuda_graph_launch(const CudaGraphHandle*, const CudaStreamResources*) { no_cuda("launching a CUDA graph"); }
size_t cuda_graph_nodes(const CudaGraphHandle*) { return 0; }
int cuda_device_count_impl() { return 0; }
size_t cuda_peak_memory(int) { return 0; }
size_t cuda_peak_reserved_memory(int) { return 0; }
size_t cuda_used_memory(int) { return 0; }
size_t cuda_total_memory(int) { return 0; }
void cuda_reset_peak(int) {}
void cuda_profiler(bool) {}
}  // namespace megadlm::detail
#endif
