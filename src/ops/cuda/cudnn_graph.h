// Internal: a small C++ layer over cuDNN's backend graph API (cudnn_graph.h of the toolkit),
// since the C++ frontend is not available here. It knows nothing about attention: descriptors,
// an operation graph under construction and its execution plans (heuristics mode A, optional
// autotuning and knob sweeps), one handle per device, a plan cache keyed by the caller's key,
// and the variant-pack launch. attention_cudnn.cpp builds the SDPA graphs on it.
// Include only where MEGADLM_WITH_CUDNN is on (the sources that link cuDNN).
//
// Environment diagnostics read here (docs/kernels/attention.md, "Environment switches"):
//   MEGADLM_CUDNN_AUTOTUNE=N  keep up to N heuristic plans per key and time them on first use
//   MEGADLM_CUDNN_KNOBS=1     also build every knob value of the heuristics' engines
// Both off by default and never under deterministic plans.
#pragma once
#include <cudnn_graph.h>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include "megadlm/core/stream.h"

namespace megadlm::ops::cuda::cudnn {

/// A plan build or launch that cuDNN refused (the message says which call and why).
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws Refused with cuDNN's status and last error string unless st is success.
void check(cudnnStatus_t st, const char* what);

/// cudnnGetVersion() of the library loaded at run time (91400 = 9.14.0).
int64_t runtime_version();

/// One backend descriptor, destroyed with the object.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  template <typename T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values,
           int64_t count = 1) {
    check(cudnnBackendSetAttribute(d_, name, type, count, values), "cudnnBackendSetAttribute");
  }
  void finalize(const char* what) { check(cudnnBackendFinalize(d_), what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::vector<int64_t>;

struct TensorRef {
  cudnnBackendDescriptor_t desc = nullptr;
  Dims dims, strides;
};

/// Unique ids of virtual tensors count up from here; the caller's non-virtual ids (its variant
/// pack's keys) stay below.
constexpr int64_t kFirstVirtualUid = 1000;

/// (unique id, device pointer) of every non-virtual tensor of one launch.
using VariantPack = std::vector<std::pair<int64_t, void*>>;

/// One operation graph under construction, then its plan(s); owns every descriptor.
class Graph {
 public:
  explicit Graph(cudnnHandle_t handle) : handle_(handle) {}

  /// A tensor descriptor (16-byte aligned), optionally virtual, by value, or with a ragged
  /// offset tensor.
  TensorRef tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                   bool is_virtual = false, bool by_value = false,
                   const TensorRef* ragged = nullptr);
  TensorRef virt(cudnnDataType_t type, const Dims& dims, const Dims& strides,
                 const TensorRef* ragged = nullptr) {
    return tensor(next_virtual_++, type, dims, strides, true, false, ragged);
  }
  TensorRef virt_like(cudnnDataType_t type, const TensorRef& like) {
    return virt(type, like.dims, like.strides);
  }
  /// A by-value fp32 scalar (dims all ones, as the frontend expands fused scalars).
  TensorRef scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  /// y = mode(x[, b[, t]]); y given (non-virtual outputs, explicit shapes).
  void pointwise_into(cudnnPointwiseMode_t mode, cudnnDataType_t compute, const TensorRef& x,
                      const TensorRef* b, const TensorRef* t, const TensorRef& y,
                      int64_t axis = -1);
  /// y = mode(x[, b[, t]]) into a new virtual tensor shaped like x.
  TensorRef pointwise(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef* b = nullptr,
                      const TensorRef* t = nullptr, cudnnDataType_t out = CUDNN_DATA_FLOAT,
                      cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    const TensorRef y = virt_like(out, x);
    pointwise_into(mode, compute, x, b, t, y, axis);
    return y;
  }
  /// c = a b (fp32 compute), with optional M/N/K override tensors (ragged or padded lengths).
  void matmul(const TensorRef& a, const TensorRef& b, const TensorRef& c,
              const TensorRef* m_override = nullptr, const TensorRef* n_override = nullptr,
              const TensorRef* k_override = nullptr);
  void reduction(cudnnReduceTensorOp_t reduce, const TensorRef& x, const TensorRef& y);
  void reshape(const TensorRef& x, const TensorRef& y);

  /// Operation graph -> heuristics (mode A) -> the first engine configuration whose plan
  /// finalizes (and, when deterministic, that is not marked nondeterministic). With
  /// `candidates` > 1 (autotune_candidates) up to that many plans are kept, in heuristic order,
  /// for autotune() to time; plan() is the first until then. Throws Refused.
  void build_plan(bool deterministic, int candidates = 1);

  cudnnBackendDescriptor_t plan() const { return plans_[chosen_]->get(); }
  /// The largest workspace of the kept plans (any of them may run).
  int64_t workspace_bytes() const { return workspace_bytes_; }
  /// The chosen plan's configuration: "#i" (position in the heuristics' list), or with
  /// MEGADLM_CUDNN_KNOBS the engine and its knob values.
  const std::string& label() const { return labels_[chosen_]; }
  size_t candidates() const { return plans_.size(); }
  void choose(size_t i) { chosen_ = i; }
  size_t chosen() const { return chosen_; }
  cudnnHandle_t handle() const { return handle_; }
  /// Whether autotune() has chosen among the candidate plans.
  bool tuned() const { return tuned_; }
  void set_tuned() { tuned_ = true; }

 private:
  struct Knob {
    cudnnBackendKnobType_t type;
    int64_t lo, hi, stride, chosen;
  };
  using Tries = std::vector<std::pair<cudnnBackendDescriptor_t, std::string>>;

  Desc& add(cudnnBackendDescriptorType_t type) { return descs_.emplace_back(type); }
  int64_t engine_knobs(cudnnBackendDescriptor_t config, std::vector<Knob>& knobs);
  cudnnBackendDescriptor_t config_with(cudnnBackendDescriptor_t graph_desc, int64_t index,
                                       const std::vector<Knob>& knobs);
  Tries knob_variants(cudnnBackendDescriptor_t graph_desc, const Tries& base);
  bool is_nondeterministic(cudnnBackendDescriptor_t config);

  cudnnHandle_t handle_;
  std::deque<Desc> descs_;  // stable addresses; destroyed with the graph
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::vector<std::unique_ptr<Desc>> plans_;  // built, in heuristic order
  std::vector<std::string> labels_;            // see label()
  size_t chosen_ = 0;
  int64_t next_virtual_ = kFirstVirtualUid;
  int64_t workspace_bytes_ = 0;
  bool tuned_ = false;
};

/// The process's cuDNN handle for a device (created on first use, never destroyed).
cudnnHandle_t handle_for(int device);

/// How many plans build_plan keeps: MEGADLM_CUDNN_AUTOTUNE=N (N >= 2; "1" means 6; at most 16),
/// else 1; always 1 for a deterministic plan (timings choose the engine, and a different engine
/// may round differently from one process to the next).
int autotune_candidates(bool deterministic);

/// Queues the graph's chosen plan with these pointers; throws Refused on failure.
void execute(const Graph& graph, const VariantPack& pack, void* workspace, const Stream& stream);

/// Times every candidate plan on the first call (2 warm-up + 5 timed runs each; the outputs are
/// overwritten by the call itself afterwards), keeps the fastest and reports the times once on
/// stderr under `what`. Nothing to do with one candidate or when already tuned.
void autotune(Graph& graph, const VariantPack& pack, void* workspace, const Stream& stream,
              const std::string& what);

/// Plans by the caller's key for the process: built on first use, and a key whose build (or a
/// launch) failed is remembered as refused, so that it costs one failure. Lock mutex() around
/// get() and refuse() and the launch that uses the plan.
template <typename Key, typename Plan>
class PlanCache {
 public:
  std::mutex& mutex() { return mutex_; }
  /// The plan of key, built by build() (returning std::shared_ptr<Plan>, throwing Refused) on
  /// first use; null, with the reason in *refusal, when refused now or before.
  template <typename Build>
  std::shared_ptr<Plan> get(const Key& key, Build&& build, std::string* refusal) {
    if (auto it = refused_.find(key); it != refused_.end()) {
      *refusal = it->second;
      return nullptr;
    }
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    try {
      std::shared_ptr<Plan> plan = build();
      plans_.emplace(key, plan);
      return plan;
    } catch (const Refused& e) {
      *refusal = e.what();
      refused_.emplace(key, *refusal);
      return nullptr;
    }
  }
  /// Drops the key's plan and refuses it from now on.
  void refuse(const Key& key, const std::string& why) {
    plans_.erase(key);
    refused_.emplace(key, why);
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<Plan>> plans_;
  std::map<Key, std::string> refused_;
};

}  // namespace megadlm::ops::cuda::cudnn
