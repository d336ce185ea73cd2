// The CUDA runtime services core needs: streams with their cuBLASLt resources, the
// stream-ordered memory pool (cudaMallocAsync; no home-made cache), copies and peak memory.
#include <cstdio>
#include <mutex>
#include <cuda_profiler_api.h>
#include "core/cuda/cuda_utils.h"
#include "core/cuda_bridge.h"

namespace megadlm::detail {

namespace {
// cuBLASLt workspace per stream: 32 MiB is what NVIDIA recommends for Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

void configure_pool_once(int device) {
  static std::once_flag flags[64];
  std::call_once(flags[device % 64], [device] {
    cudaMemPool_t pool;
    MDLM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    // Keep freed memory in the pool instead of returning it to the driver at every sync.
    uint64_t threshold = UINT64_MAX;
    MDLM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
}
}  // namespace

void throw_cuda_error(const char* call, int code, const char* name, const char* msg,
                      const char* file, int line) {
  throw_error(file, line,
              concat("CUDA call failed: ", call, " returned ", code, " (", name, ": ", msg, ")"));
}

CudaStreamResources::~CudaStreamResources() {
  // Destructors must not throw: report and continue.
  cudaSetDevice(device);
  if (workspace) cudaFreeAsync(workspace, stream);
  if (cublaslt) cublasLtDestroy(cublaslt);
  if (stream) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

std::shared_ptr<CudaStreamResources> cuda_create_stream(int device) {
  int count = cuda_device_count_impl();
  MDLM_CHECK(device >= 0 && device < count, "CUDA device ", device, " requested but ", count,
             " device(s) are visible");
  MDLM_CUDA_CHECK(cudaSetDevice(device));
  configure_pool_once(device);
  auto res = std::make_shared<CudaStreamResources>();
  res->device = device;
  MDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&res->stream, cudaStreamNonBlocking));
  MDLM_CUBLAS_CHECK(cublasLtCreate(&res->cublaslt));
  res->workspace_bytes = kCublasWorkspaceBytes;
  MDLM_CUDA_CHECK(cudaMallocAsync(&res->workspace, res->workspace_bytes, res->stream));
  return res;
}

void* cuda_stream_native(const CudaStreamResources* res) { return res->stream; }

void cuda_stream_synchronize(const CudaStreamResources* res) {
  MDLM_CUDA_CHECK(cudaStreamSynchronize(res->stream));
}

void* cuda_malloc_async(size_t bytes, const std::shared_ptr<CudaStreamResources>& res,
                        std::shared_ptr<void>* releaser) {
  void* p = nullptr;
  cudaError_t err = cudaMallocAsync(&p, bytes, res->stream);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    MDLM_FAIL("CUDA out of memory: cudaMallocAsync(", bytes, " bytes) on device ", res->device,
              " failed (", cudaGetErrorName(err), "); ", free_b >> 20, " MiB free of ",
              total_b >> 20, " MiB, ", cuda_used_memory(res->device) >> 20,
              " MiB held by megadlm. Reduce --micro-batch-size or --seq-length.");
  }
  std::shared_ptr<CudaStreamResources> keep = res;
  *releaser = std::shared_ptr<void>(p, [keep](void* q) {
    cudaSetDevice(keep->device);
    cudaFreeAsync(q, keep->stream);
  });
  return p;
}

void cuda_copy_bytes(const void* src, Device src_device, void* dst, Device dst_device, size_t bytes,
                     const CudaStreamResources* res) {
  MDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, res->stream));
  if (dst_device.is_cpu()) MDLM_CUDA_CHECK(cudaStreamSynchronize(res->stream));
  (void)src_device;
}

void cuda_memset_zero(void* ptr, size_t bytes, const CudaStreamResources* res) {
  MDLM_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, res->stream));
}

void cuda_set_device(int device) { MDLM_CUDA_CHECK(cudaSetDevice(device)); }

CudaEventHandle::~CudaEventHandle() {
  if (event) cudaEventDestroy(event);  // destructors must not throw
}

std::shared_ptr<CudaEventHandle> cuda_event_create(int device) {
  int count = cuda_device_count_impl();
  MDLM_CHECK(device >= 0 && device < count, "CUDA event for device ", device, " requested but ",
             count, " device(s) are visible");
  MDLM_CUDA_CHECK(cudaSetDevice(device));
  auto ev = std::make_shared<CudaEventHandle>();
  ev->device = device;
  MDLM_CUDA_CHECK(cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming));
  return ev;
}

void cuda_event_record(CudaEventHandle* ev, const CudaStreamResources* res) {
  MDLM_CUDA_CHECK(cudaEventRecord(ev->event, res->stream));
}

void cuda_event_wait(const CudaEventHandle* ev, const CudaStreamResources* res) {
  MDLM_CUDA_CHECK(cudaStreamWaitEvent(res->stream, ev->event, 0));
}

bool cuda_event_query(const CudaEventHandle* ev) {
  const cudaError_t err = cudaEventQuery(ev->event);
  if (err == cudaErrorNotReady) return false;
  MDLM_CUDA_CHECK(err);
  return true;
}

void cuda_event_synchronize(const CudaEventHandle* ev) {
  MDLM_CUDA_CHECK(cudaEventSynchronize(ev->event));
}

CudaGraphHandle::~CudaGraphHandle() {
  // Destructors must not throw: the exec first (it may use the graph's allocations), then the graph.
  cudaSetDevice(device);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
}

std::shared_ptr<CudaGraphHandle> cuda_graph_capture(const CudaStreamResources* res,
                                                    const std::function<void()>& work) {
  MDLM_CUDA_CHECK(cudaSetDevice(res->device));
  MDLM_CUDA_CHECK(cudaStreamBeginCapture(res->stream, cudaStreamCaptureModeThreadLocal));
  auto g = std::make_shared<CudaGraphHandle>();
  g->device = res->device;
  try {
    work();
  } catch (...) {
    // End the capture so that the stream takes work again; its partial graph is dropped.
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(res->stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();  // clear the capture's error
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(res->stream, &g->graph);
  if (ended != cudaSuccess) {
    cudaGetLastError();
    MDLM_FAIL("the captured work queued an operation a CUDA graph cannot hold (", cudaGetErrorName(ended), ": ",
              cudaGetErrorString(ended), "): a host synchronisation, a copy to or from pageable host memory, "
              "or a free of memory allocated before the capture");
  }
  MDLM_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  return g;
}

void cuda_graph_launch(const CudaGraphHandle* graph, const CudaStreamResources* res) {
  MDLM_CHECK(graph->device == res->device, "a CUDA graph captured on device ", graph->device,
             " replayed on a stream of device ", res->device);
  MDLM_CUDA_CHECK(cudaGraphLaunch(graph->exec, res->stream));
}

size_t cuda_graph_nodes(const CudaGraphHandle* graph) {
  size_t n = 0;
  MDLM_CUDA_CHECK(cudaGraphGetNodes(graph->graph, nullptr, &n));
  return n;
}

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

size_t cuda_peak_memory(int device) {
  cudaMemPool_t pool;
  MDLM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t v = 0;
  MDLM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v));
  return v;
}

size_t cuda_peak_reserved_memory(int device) {
  cudaMemPool_t pool;
  MDLM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t v = 0;
  MDLM_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &v));
  return v;
}

size_t cuda_used_memory(int device) {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return 0;
  uint64_t v = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v);
  return v;
}

size_t cuda_total_memory(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 0;
  return prop.totalGlobalMem;
}

void cuda_reset_peak(int device) {
  cudaMemPool_t pool;
  MDLM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t zero = 0;
  MDLM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  MDLM_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
}

void cuda_profiler(bool start) {
  MDLM_CUDA_CHECK(cudaDeviceSynchronize());
  MDLM_CUDA_CHECK(start ? cudaProfilerStart() : cudaProfilerStop());
}

}  // namespace megadlm::detail
