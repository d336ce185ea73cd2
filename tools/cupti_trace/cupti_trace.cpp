// A CUPTI activity tracer loaded into any CUDA program through CUDA_INJECTION64_PATH: it records
// every kernel, memcpy and memset on the GPU (start, end, stream, name) and every CUDA runtime
// API call on the host (start, end, name, correlation id) and writes them as one JSON line each
// to $MEGADLM_TRACE_FILE at exit. scripts/trace_gaps.py turns the file into the GPU's idle time
// and what the host was doing meanwhile — which a per-kernel profiler (ncu) cannot show.
// Only records inside cudaProfilerStart/Stop when MEGADLM_TRACE_RANGE=1 (pretrain_difflm's
// --profile, generate_bench's MEGADLM_PROFILE_GENERATION set that range; the last one is kept).
#include <cupti.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8u << 20;
std::mutex g_mutex;
std::vector<std::string> g_lines;
bool g_range_only = false;
bool g_recording = true;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string quoted(const char* s) {
  std::string r = "\"";
  for (const char* p = s ? s : "?"; *p; ++p) {
    if (*p == '"' || *p == '\\') r += '\\';
    if (static_cast<unsigned char>(*p) >= 0x20) r += *p;
  }
  return r + "\"";
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<std::string> lines;
  char line[512];
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel9*>(record);
        std::snprintf(line, sizeof line, "{\"k\":\"kernel\",\"s\":%llu,\"e\":%llu,\"stream\":%u,\"corr\":%u,\"name\":",
                      (unsigned long long)k->start, (unsigned long long)k->end, k->streamId, k->correlationId);
        lines.push_back(std::string(line) + quoted(k->name) + "}");
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
        std::snprintf(line, sizeof line,
                      "{\"k\":\"memcpy\",\"s\":%llu,\"e\":%llu,\"stream\":%u,\"corr\":%u,\"bytes\":%llu,\"kind\":%u}",
                      (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, m->correlationId,
                      (unsigned long long)m->bytes, (unsigned)m->copyKind);
        lines.push_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(record);
        std::snprintf(line, sizeof line, "{\"k\":\"memset\",\"s\":%llu,\"e\":%llu,\"stream\":%u,\"corr\":%u}",
                      (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, m->correlationId);
        lines.push_back(line);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        cuptiGetCallbackName(record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                          : CUPTI_CB_DOMAIN_DRIVER_API,
                             a->cbid, &name);
        std::snprintf(line, sizeof line, "{\"k\":\"%s\",\"s\":%llu,\"e\":%llu,\"corr\":%u,\"tid\":%u,\"name\":",
                      record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? "api" : "driver",
                      (unsigned long long)a->start, (unsigned long long)a->end, a->correlationId, a->threadId);
        lines.push_back(std::string(line) + quoted(name) + "}");
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_recording || !g_range_only)
    for (auto& l : lines) g_lines.push_back(std::move(l));
}

void enable(bool on) {
  const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                      CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};
  for (CUpti_ActivityKind k : kinds) on ? cuptiActivityEnable(k) : cuptiActivityDisable(k);
}

// With MEGADLM_TRACE_RANGE=1, recording follows cudaProfilerStart / cudaProfilerStop.
void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && info->callbackSite == CUPTI_API_EXIT) {
    cuptiActivityFlushAll(0);
    { std::lock_guard<std::mutex> lock(g_mutex); g_lines.clear(); g_recording = true; }
    enable(true);
  } else if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && info->callbackSite == CUPTI_API_ENTER) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    enable(false);
    std::lock_guard<std::mutex> lock(g_mutex);
    g_recording = false;
  }
}

void write_trace() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("MEGADLM_TRACE_FILE");
  FILE* f = std::fopen(path && *path ? path : "cupti_trace.jsonl", "w");
  if (!f) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& l : g_lines) std::fprintf(f, "%s\n", l.c_str());
  std::fclose(f);
  std::fprintf(stderr, "cupti_trace: %zu records written\n", g_lines.size());
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* range = std::getenv("MEGADLM_TRACE_RANGE");
  g_range_only = range && std::strcmp(range, "1") == 0;
  g_recording = !g_range_only;
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, on_callback, nullptr) == CUPTI_SUCCESS) {
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000);
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000);
  }
  if (!g_range_only) enable(true);
  std::atexit(write_trace);
  return 1;
}
