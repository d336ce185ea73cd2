// cuDNN backend of the attention family (contract in attention_cudnn.h): cuDNN's fused flash
// attention through the backend graph API, since the C++ frontend is not available here.
//
// The graphs are the composite SDPA graphs the frontend emits (gpu-libraries.md §1.4, §1.5),
// node for node, because cuDNN's heuristics only offer its fused engine for graphs matching that
// pattern. Logical dims are always [b, h, s, d]; megadlm's [B, S, H, D] tensors enter through
// their strides ({S H D, D, H D, 1}); K enters the first product as K^T (axes 2 and 3 swapped).
// Stats, cuDNN's softmax statistic, is max + log(sum exp(x - max)) of the scaled, masked scores:
// natural log, [b, h, s, 1] with strides {h s, s, 1, 1}, i.e. exactly our lse [B, Hq, S], so
// dense calls hand our lse buffer to cuDNN as is.
//
// Packed documents (document_ids) run as one ragged batch: batch = documents (rounded up to a
// power of two so that few plans exist; the extra documents are empty), logical s = S, every
// tensor with a ragged offset (element offset of each document) and the padding mask
// (per-document lengths). The statistics stay in our lse [B, Hq, S]: the dense strides plus a
// per-document offset (documents never cross rows), so no kernel converts them (the forward
// at ~1024-token documents 0.145 -> 0.142 ms on the H200); MEGADLM_CUDNN_THD_STATS=1 falls back
// to cuDNN's ragged [tokens, Hq] layout and the conversion kernels (attention_cudnn_prep.cu).
//
// Determinism: the default backward accumulates dQ in an fp32 buffer (not reproducible); the
// deterministic graph writes dQ from one product (the frontend's "dP workspace" variant) and
// only engines without CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC are accepted.
//
// cuDNN version: built against the toolkit's headers, run against whatever libcudnn.so.9 loads
// (9.14 on the benchmark machine): only attributes present in 9.14 are used and features are
// gated on cudnnGetVersion(). Plans are cached per shape key for the process (file-local, under
// a mutex, like the cuBLASLt algorithm cache in gemm.cpp); a key whose build failed is
// remembered as refused so that it costs one failed build.
#include "ops/cuda/attention_cudnn.h"
#include "ops/attention_support.h"

#if MEGADLM_WITH_CUDNN
#include <cudnn_graph.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/attention_cudnn_prep.h"
#include "ops/cuda/internal.h"

// The operation-graph and execution-plan HANDLE attributes are deprecated in the 9.19 headers
// but still what the frontend sets (and 9.14 expects).
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace megadlm::ops::cuda {
namespace {

/// A plan build or launch that cuDNN refused; becomes CudnnRun::refusal.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw Refused(std::string(what) + ": " + cudnnGetErrorString(st) + (last[0] ? std::string(" (") + last + ")" : ""));
}

int64_t runtime_version() { return static_cast<int64_t>(cudnnGetVersion()); }

// ---- descriptors ----------------------------------------------------------------------------

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

// Unique ids of the non-virtual tensors (the variant pack's keys); virtual ones count up from
// kFirstVirtualUid.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kSeqQ, kSeqKv, kDout, kDq, kDk, kDv,
  kSoftmaxSum, kDqAccum, kDkFull, kDvFull, kOffQ, kOffK, kOffV, kOffO, kOffStats,
  kFirstVirtualUid = 1000
};

/// Whether an on/off environment variable is set to something other than "" or "0".
bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 && *v != '0';
}

/// MEGADLM_CUDNN_KNOBS=1: build every knob variant of the heuristics' engines and let autotune
/// time them (Graph::knob_variants); off by default.
bool knob_sweep_enabled() {
  static const bool on = env_flag("MEGADLM_CUDNN_KNOBS");
  return on;
}

/// Where a ragged graph's softmax statistics live: by default in megadlm's lse [B, Hq, S] itself
/// (the dense strides, a per-document offset: no conversion kernels); MEGADLM_CUDNN_THD_STATS=1
/// keeps cuDNN's ragged [tokens, Hq] layout in a scratch buffer converted to and from lse.
bool thd_statistics() {
  static const bool on = env_flag("MEGADLM_CUDNN_THD_STATS");
  return on;
}

/// One operation graph under construction, then its plan; owns every descriptor.
class Graph {
 public:
  explicit Graph(cudnnHandle_t handle) : handle_(handle) {}

  TensorRef tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                   bool is_virtual = false, bool by_value = false,
                   const TensorRef* ragged = nullptr) {
    Desc& t = add(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t n = static_cast<int64_t>(dims.size()), alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), n);
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), n);
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    if (is_virtual) {
      const bool v = true;
      t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &v);
    }
    if (by_value) {
      const bool v = true;
      t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &v);
    }
    if (ragged != nullptr) {
      t.set(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &ragged->desc);
    }
    t.finalize("tensor descriptor");
    return {t.get(), dims, strides};
  }
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
                      int64_t axis = -1) {
    Desc& pw = add(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &compute);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw.finalize("pointwise descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const cudnnBackendDescriptor_t pwd = pw.get();
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, &pwd);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x.desc);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b->desc);
    if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &t->desc);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y.desc);
    const float one = 1.0f;
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, &one);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, &one);
    op.finalize("pointwise operation");
    ops_.push_back(op.get());
  }
  /// y = mode(x[, b[, t]]) into a new virtual tensor shaped like x.
  TensorRef pointwise(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef* b = nullptr,
                      const TensorRef* t = nullptr, cudnnDataType_t out = CUDNN_DATA_FLOAT,
                      cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    const TensorRef y = virt_like(out, x);
    pointwise_into(mode, compute, x, b, t, y, axis);
    return y;
  }

  void matmul(const TensorRef& a, const TensorRef& b, const TensorRef& c,
              const TensorRef* m_override = nullptr, const TensorRef* n_override = nullptr,
              const TensorRef* k_override = nullptr) {
    Desc& mm = add(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
    mm.finalize("matmul descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    const cudnnBackendDescriptor_t mmd = mm.get();
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &a.desc);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b.desc);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &c.desc);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &mmd);
    if (m_override != nullptr)
      op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &m_override->desc);
    if (n_override != nullptr)
      op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &n_override->desc);
    if (k_override != nullptr)
      op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &k_override->desc);
    op.finalize("matmul operation");
    ops_.push_back(op.get());
  }

  void reduction(cudnnReduceTensorOp_t reduce, const TensorRef& x, const TensorRef& y) {
    Desc& rd = add(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &reduce);
    rd.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute);
    rd.finalize("reduction descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    const cudnnBackendDescriptor_t rdd = rd.get();
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x.desc);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y.desc);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &rdd);
    op.finalize("reduction operation");
    ops_.push_back(op.get());
  }

  void reshape(const TensorRef& x, const TensorRef& y) {
    Desc& op = add(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x.desc);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y.desc);
    op.finalize("reshape operation");
    ops_.push_back(op.get());
  }

  /// Operation graph -> heuristics (mode A) -> the first engine configuration whose plan
  /// finalizes (and, when deterministic, that is not marked nondeterministic). With
  /// `candidates` > 1 (MEGADLM_CUDNN_AUTOTUNE) up to that many plans are kept, in heuristic
  /// order, for autotune() to time; plan() is the first until then.
  void build_plan(bool deterministic, int candidates = 1) {
    Desc& graph = add(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
              static_cast<int64_t>(ops_.size()));
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
    graph.finalize("operation graph");
    const cudnnBackendDescriptor_t graph_desc = graph.get();
    Desc& heur = add(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph_desc);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    heur.finalize("engine heuristics");
    int64_t count = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          "engine heuristics count");
    if (count <= 0) throw Refused("cuDNN's heuristics offer no engine for this attention graph");
    std::vector<cudnnBackendDescriptor_t> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(add(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    int64_t returned = 0;
    check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, configs.data()),
          "engine heuristics results");
    // (configuration, label) in the order they are tried: the heuristics' list, or with
    // MEGADLM_CUDNN_KNOBS its engines' knob variants.
    std::vector<std::pair<cudnnBackendDescriptor_t, std::string>> tries;
    for (int64_t i = 0; i < returned; ++i)
      tries.emplace_back(configs[static_cast<size_t>(i)], megadlm::detail::concat("#", i));
    const bool sweep = knob_sweep_enabled() && !deterministic;  // timing never picks a deterministic plan
    if (sweep) tries = knob_variants(graph_desc, tries);
    std::string last_error = "no engine configuration";
    for (const auto& [config, label] : tries) {
      if (deterministic && is_nondeterministic(config)) {
        last_error = "every engine is marked nondeterministic";
        continue;
      }
      try {
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &config);
        plan->finalize("execution plan");
        int64_t ws = 0, n = 0;
        check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &ws),
              "plan workspace size");
        workspace_bytes_ = std::max(workspace_bytes_, ws);
        plans_.push_back(std::move(plan));
        labels_.push_back(label);
        if (static_cast<int>(plans_.size()) >= candidates && !sweep) return;
      } catch (const Refused& e) {
        last_error = e.what();
      }
    }
    if (!plans_.empty()) return;
    throw Refused(std::to_string(returned) + " engine configurations, none builds: " + last_error);
  }

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

 private:
  Desc& add(cudnnBackendDescriptorType_t type) { return descs_.emplace_back(type); }

  struct Knob {
    cudnnBackendKnobType_t type;
    int64_t lo, hi, stride, chosen;
  };

  /// The global index of a configuration's engine, and the engine's knobs with the values the
  /// configuration chose.
  int64_t engine_knobs(cudnnBackendDescriptor_t config, std::vector<Knob>& knobs) {
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0, index = -1;
    check(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   1, &n, &e),
          "engine of a configuration");
    check(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index),
          "engine global index");
    std::deque<Desc> infos, choices;
    std::vector<cudnnBackendDescriptor_t> info_ptrs, choice_ptrs;
    for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
      info_ptrs.push_back(infos.emplace_back(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR).get());
      choice_ptrs.push_back(choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR).get());
    }
    int64_t n_info = 0, n_choice = 0;
    check(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_KNOB_INFO, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   CUDNN_KNOB_TYPE_COUNTS, &n_info, info_ptrs.data()),
          "engine knob info");
    check(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   CUDNN_KNOB_TYPE_COUNTS, &n_choice, choice_ptrs.data()),
          "engine configuration knob choices");
    for (int64_t i = 0; i < n_info && i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
      Knob k{};
      const cudnnBackendDescriptor_t d = info_ptrs[static_cast<size_t>(i)];
      check(cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &k.type), "knob type");
      check(cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &k.lo), "knob min");
      check(cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE, CUDNN_TYPE_INT64, 1, &n, &k.hi), "knob max");
      check(cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_INFO_STRIDE, CUDNN_TYPE_INT64, 1, &n, &k.stride), "knob stride");
      k.chosen = k.lo;
      knobs.push_back(k);
    }
    for (int64_t i = 0; i < n_choice && i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
      cudnnBackendKnobType_t type{};
      int64_t value = 0;
      const cudnnBackendDescriptor_t d = choice_ptrs[static_cast<size_t>(i)];
      check(cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type),
            "knob choice type");
      check(cudnnBackendGetAttribute(d, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n, &value),
            "knob choice value");
      for (Knob& k : knobs)
        if (k.type == type) k.chosen = value;
    }
    return index;
  }

  /// A finalized configuration of engine `index` of this graph with these knob values.
  cudnnBackendDescriptor_t config_with(cudnnBackendDescriptor_t graph_desc, int64_t index,
                                       const std::vector<Knob>& knobs) {
    Desc& engine = add(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    engine.set(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &graph_desc);
    engine.set(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, &index);
    engine.finalize("engine");
    std::vector<cudnnBackendDescriptor_t> choices;
    for (const Knob& k : knobs) {
      Desc& c = add(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      c.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, &k.type);
      c.set(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, &k.chosen);
      c.finalize("knob choice");
      choices.push_back(c.get());
    }
    Desc& config = add(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    const cudnnBackendDescriptor_t e = engine.get();
    config.set(CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, &e);
    if (!choices.empty())
      config.set(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, choices.data(),
                 static_cast<int64_t>(choices.size()));
    config.finalize("engine configuration");
    return config.get();
  }

  /// MEGADLM_CUDNN_KNOBS: each heuristic configuration, then the same engine with each other
  /// value of one of its knobs (at most 64 a knob), for autotune to time; each engine's knobs
  /// go to stderr. A diagnostic: cuDNN 9.14's SDPA engines have one knob (KERNEL_CFG) and on
  /// the fast engine only the heuristics' value builds (docs/benchmarks.md, session 8).
  std::vector<std::pair<cudnnBackendDescriptor_t, std::string>> knob_variants(
      cudnnBackendDescriptor_t graph_desc, const std::vector<std::pair<cudnnBackendDescriptor_t, std::string>>& base) {
    std::vector<std::pair<cudnnBackendDescriptor_t, std::string>> out;
    auto describe = [](int64_t index, const std::vector<Knob>& ks) {
      std::string s = megadlm::detail::concat("e", index);
      for (const Knob& k : ks) s += megadlm::detail::concat(" k", static_cast<int>(k.type), "=", k.chosen);
      return s;
    };
    for (const auto& [config, label] : base) {
      std::vector<Knob> knobs;
      int64_t index = -1;
      try {
        index = engine_knobs(config, knobs);
      } catch (const Refused& e) {
        std::fprintf(stderr, "megadlm: cuDNN knobs of %s: %s\n", label.c_str(), e.what());
        out.emplace_back(config, label);
        continue;
      }
      std::string info;
      for (const Knob& k : knobs)
        info += megadlm::detail::concat(" k", static_cast<int>(k.type), " [", k.lo, ", ", k.hi, "] /", k.stride,
                                        " chose ", k.chosen, ";");
      std::fprintf(stderr, "megadlm: cuDNN %s = engine %lld, knobs:%s\n", label.c_str(),
                   static_cast<long long>(index), info.empty() ? " none" : info.c_str());
      out.emplace_back(config, label + " " + describe(index, knobs));
      for (size_t j = 0; j < knobs.size(); ++j) {
        const int64_t step = std::max<int64_t>(1, knobs[j].stride);
        for (int64_t x = knobs[j].lo, n = 0; x <= knobs[j].hi && n < 64; x += step, ++n) {
          if (x == knobs[j].chosen) continue;
          std::vector<Knob> ks = knobs;
          ks[j].chosen = x;
          try {
            out.emplace_back(config_with(graph_desc, index, ks), label + " " + describe(index, ks));
          } catch (const Refused&) {  // a value this graph cannot use
          }
        }
      }
    }
    return out;
  }

  bool is_nondeterministic(cudnnBackendDescriptor_t config) {
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0;
    check(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   1, &n, &e),
          "engine of a configuration");
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t count = 0;
    check(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes),
          "engine numerical notes");
    for (int64_t i = 0; i < count && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i)
      if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
    return false;
  }

  cudnnHandle_t handle_;
  std::deque<Desc> descs_;  // stable addresses; destroyed with the graph
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::vector<std::unique_ptr<Desc>> plans_;  // built, in heuristic order
  std::vector<std::string> labels_;            // see label()
  size_t chosen_ = 0;
  int64_t next_virtual_ = kFirstVirtualUid;
  int64_t workspace_bytes_ = 0;
};

// ---- plan keys and the cache ----------------------------------------------------------------

struct Key {
  int device;
  bool backward;
  int64_t b, h, hk, s, d;  ///< b: batch rows, or (ragged) the document bucket
  int64_t row_q, row_kv;   ///< elements from one token to the next in q (dq) and k, v (dk, dv)
  bool causal, ragged, deterministic;
  bool row_padding;  ///< forward with AttentionArgs::row_lengths: dense rows, padding mask
  auto tie() const {
    return std::tie(device, backward, b, h, hk, s, d, row_q, row_kv, causal, ragged, deterministic,
                    row_padding);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

/// A built plan plus the sizes of the graph's non-virtual scratch tensors (outside cuDNN's own
/// workspace, as the frontend allocates them).
struct Plan {
  std::unique_ptr<Graph> graph;
  bool padding = false;  ///< the graph has the padding mask (ragged, or the 9.14 workaround)
  // Bytes per token (of the call's B * S) of the backward's scratch tensors: sized by the
  // tokens that exist, not by documents x S (the frontend's max_total_seq_len).
  int64_t softmax_sum_per_token = 0;
  int64_t dq_accum_per_token = 0;                    ///< non-deterministic only
  int64_t dk_full_per_token = 0, dv_full_per_token = 0;  ///< ragged GQA only
  /// The padding workaround's constant sequence lengths (b entries = s), owned for the process.
  int32_t* constant_seq_len = nullptr;
  bool tuned = false;  ///< autotune() has chosen among the graph's candidate plans
};

/// MEGADLM_CUDNN_AUTOTUNE=N (N >= 2; "1" means 6): keep up to N of the heuristics' engine
/// configurations per plan key and time them on the key's first call (autotune below) instead
/// of taking the first. Off by default and under --deterministic-mode: the choice depends on
/// timings, and a different engine may round differently from one process to the next.
int autotune_candidates(const Key& key) {
  static const int n = [] {
    const char* v = std::getenv("MEGADLM_CUDNN_AUTOTUNE");
    if (v == nullptr || *v == 0) return 1;
    const int k = std::atoi(v);
    return k == 1 ? 6 : std::max(1, std::min(k, 16));
  }();
  return key.deterministic ? 1 : n;
}

struct Cache {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles;
  std::map<Key, std::shared_ptr<Plan>> plans;
  std::map<Key, std::string> refused;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: handles and plans live for the process
  return *c;
}

cudnnHandle_t handle_for(int device) {
  Cache& c = cache();
  auto it = c.handles.find(device);
  if (it != c.handles.end()) return it->second;
  int current = 0;
  MDLM_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) MDLM_CUDA_CHECK(cudaSetDevice(device));
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = cudnnCreate(&h);
  if (current != device) MDLM_CUDA_CHECK(cudaSetDevice(current));
  check(st, "cudnnCreate");
  c.handles.emplace(device, h);
  return h;
}

// ---- the graphs -----------------------------------------------------------------------------

/// Logical [b, h, s, d] dims and the strides of megadlm's token-major tensors: q (and dq) and
/// k, v (and dk, dv) with token strides row_q and row_kv (h d and hk d for separate tensors, the
/// packed row (h + 2 hk) d for the fused QKV buffer); out and dout always contiguous [B, S, H, D].
struct Shapes {
  int64_t b, h, hk, s, d, row_q, row_kv;
  explicit Shapes(const Key& k) : b(k.b), h(k.h), hk(k.hk), s(k.s), d(k.d), row_q(k.row_q), row_kv(k.row_kv) {}
  Dims q_dims() const { return {b, h, s, d}; }
  Dims q_strides() const { return {s * row_q, d, row_q, 1}; }
  Dims o_strides() const { return {s * h * d, d, h * d, 1}; }
  Dims kv_dims() const { return {b, hk, s, d}; }
  Dims kv_strides() const { return {s * row_kv, d, row_kv, 1}; }
  Dims kt_dims() const { return {b, hk, d, s}; }
  Dims kt_strides() const { return {s * row_kv, d, 1, row_kv}; }
  Dims stat_dims() const { return {b, h, s, 1}; }
  Dims stat_strides(bool ragged) const {
    return ragged && thd_statistics() ? Dims{h * s, 1, h, 1} : Dims{h * s, s, 1, 1};
  }
  Dims score_dims() const { return {b, h, s, s}; }
  Dims score_strides() const { return {h * s * s, s * s, s, 1}; }
  Dims score_t_strides() const { return {h * s * s, s * s, 1, s}; }  // [b, h, s_kv, s_q] view
};

struct Ragged {
  TensorRef q, k, v, o, stats;
};

Ragged ragged_offsets(Graph& g, const Shapes& x) {
  const Dims dims{x.b + 1, 1, 1, 1}, strides{1, 1, 1, 1};
  return {g.tensor(kOffQ, CUDNN_DATA_INT64, dims, strides), g.tensor(kOffK, CUDNN_DATA_INT64, dims, strides),
          g.tensor(kOffV, CUDNN_DATA_INT64, dims, strides), g.tensor(kOffO, CUDNN_DATA_INT64, dims, strides),
          g.tensor(kOffStats, CUDNN_DATA_INT64, dims, strides)};
}

/// Scores outside [0, seq_len_q) x [0, seq_len_kv) of each batch entry become -inf (the
/// frontend's padding_mask score modifier).
TensorRef padding_mask(Graph& g, const TensorRef& s, const TensorRef& seq_q, const TensorRef& seq_kv,
                       const TensorRef& neg_inf) {
  const TensorRef row = g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, CUDNN_DATA_INT32,
                                    CUDNN_DATA_INT32, 2);
  const TensorRef col = g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, CUDNN_DATA_INT32,
                                    CUDNN_DATA_INT32, 3);
  const TensorRef row_ok = g.pointwise(CUDNN_POINTWISE_CMP_LT, row, &seq_q, nullptr,
                                       CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
  const TensorRef col_ok = g.pointwise(CUDNN_POINTWISE_CMP_LT, col, &seq_kv, nullptr,
                                       CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
  const TensorRef ok = g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_ok, &col_ok, nullptr,
                                   CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
  return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &neg_inf, &ok);
}

/// Scores with key index > query index become -inf (top-left diagonal, right bound 0: the
/// frontend's causal mask as its composite diagonal-band node spells it).
TensorRef causal_mask(Graph& g, const TensorRef& s, const TensorRef& neg_inf) {
  const TensorRef row = g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, CUDNN_DATA_INT32,
                                    CUDNN_DATA_FLOAT, 2);
  const TensorRef col = g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, CUDNN_DATA_INT32,
                                    CUDNN_DATA_FLOAT, 3);
  const TensorRef keep = g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, CUDNN_DATA_BOOLEAN,
                                     CUDNN_DATA_BOOLEAN);
  return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &neg_inf, &keep);
}

/// §1.4: S = scale Q K^T (masked), Stats = max + log(sum exp), O = softmax(S) V.
std::shared_ptr<Plan> build_forward(cudnnHandle_t handle, const Key& key) {
  auto plan = std::make_shared<Plan>();
  plan->graph = std::make_unique<Graph>(handle);
  Graph& g = *plan->graph;
  const Shapes x(key);
  const bool ragged = key.ragged;
  plan->padding = ragged || key.row_padding;
  Ragged off;
  if (ragged) off = ragged_offsets(g, x);
  const TensorRef q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, x.q_dims(), x.q_strides(), false, false, ragged ? &off.q : nullptr);
  const TensorRef kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, x.kt_dims(), x.kt_strides(), false, false, ragged ? &off.k : nullptr);
  const TensorRef v = g.tensor(kV, CUDNN_DATA_BFLOAT16, x.kv_dims(), x.kv_strides(), false, false, ragged ? &off.v : nullptr);
  const TensorRef o = g.tensor(kO, CUDNN_DATA_BFLOAT16, x.q_dims(), x.o_strides(), false, false, ragged ? &off.o : nullptr);
  const TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(ragged), false, false,
                                   ragged ? &off.stats : nullptr);
  const TensorRef scale = g.scalar(kScale);
  TensorRef seq_q, seq_kv, neg_inf;
  if (plan->padding) {
    seq_q = g.tensor(kSeqQ, CUDNN_DATA_INT32, {x.b, 1, 1, 1}, {1, 1, 1, 1});
    seq_kv = g.tensor(kSeqKv, CUDNN_DATA_INT32, {x.b, 1, 1, 1}, {1, 1, 1, 1});
  }
  if (plan->padding || key.causal) neg_inf = g.scalar(kNegInf);

  TensorRef s = g.virt(CUDNN_DATA_FLOAT, x.score_dims(), x.score_strides());
  g.matmul(q, kt, s, plan->padding ? &seq_q : nullptr, plan->padding ? &seq_kv : nullptr);
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, &scale);
  if (plan->padding) s = padding_mask(g, s, seq_q, seq_kv, neg_inf);
  if (key.causal) s = causal_mask(g, s, neg_inf);
  // Softmax with its statistic (the frontend's composite softmax node).
  const TensorRef max = g.virt(CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(false));
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, max);
  const TensorRef shifted = g.pointwise(CUDNN_POINTWISE_SUB, s, &max);
  const TensorRef e = g.pointwise(CUDNN_POINTWISE_EXP, shifted);
  const TensorRef sum = g.virt(CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(false));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const TensorRef log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum);
  g.pointwise_into(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, &log_sum, nullptr, stats);
  // P takes the I/O type: cuDNN wants the second product's A operand in bf16.
  const TensorRef p = g.virt_like(CUDNN_DATA_BFLOAT16, s);
  g.pointwise_into(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, &sum, nullptr, p);
  g.matmul(p, v, o, plan->padding ? &seq_q : nullptr, nullptr, plan->padding ? &seq_kv : nullptr);
  g.build_plan(false, autotune_candidates(key));
  return plan;
}

/// §1.5: Delta = rowsum(dO O); P = exp(scale Q K^T - Stats); dV = P^T dO;
/// dS = P (dO V^T - Delta) scale; dK = dS^T Q; dQ = dS K. GQA: full-head dK/dV summed over the
/// group by a reduction.
std::shared_ptr<Plan> build_backward(cudnnHandle_t handle, const Key& key) {
  auto plan = std::make_shared<Plan>();
  plan->graph = std::make_unique<Graph>(handle);
  Graph& g = *plan->graph;
  const Shapes x(key);
  const bool ragged = key.ragged, gqa = key.h != key.hk;
  const int64_t group = key.h / key.hk;
  // cuDNN <= 9.15.0: a backward with s % 128 != 0 and no padding mask can fault (the frontend
  // adds a padding mask with full lengths; gpu-libraries.md §1.8).
  plan->padding = ragged || (key.s % 128 != 0 && runtime_version() <= 91500);
  Ragged off;
  if (ragged) off = ragged_offsets(g, x);
  auto io = [&](int64_t uid, const Dims& dims, const Dims& strides, const TensorRef* r) {
    return g.tensor(uid, CUDNN_DATA_BFLOAT16, dims, strides, false, false, ragged ? r : nullptr);
  };
  const TensorRef q = io(kQ, x.q_dims(), x.q_strides(), &off.q);
  const TensorRef kt = io(kK, x.kt_dims(), x.kt_strides(), &off.k);
  const TensorRef vt = io(kV, x.kt_dims(), x.kt_strides(), &off.v);
  const TensorRef o = io(kO, x.q_dims(), x.o_strides(), &off.o);
  const TensorRef dout = io(kDout, x.q_dims(), x.o_strides(), &off.o);
  const TensorRef dq = io(kDq, x.q_dims(), x.q_strides(), &off.q);
  const TensorRef dk = io(kDk, x.kv_dims(), x.kv_strides(), &off.k);
  const TensorRef dv = io(kDv, x.kv_dims(), x.kv_strides(), &off.v);
  const TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(ragged), false, false,
                                   ragged ? &off.stats : nullptr);
  const TensorRef scale = g.scalar(kScale);
  const TensorRef one = g.scalar(kOne);
  TensorRef seq_q, seq_kv, neg_inf;
  if (plan->padding) {
    seq_q = g.tensor(kSeqQ, CUDNN_DATA_INT32, {x.b, 1, 1, 1}, {1, 1, 1, 1});
    seq_kv = g.tensor(kSeqKv, CUDNN_DATA_INT32, {x.b, 1, 1, 1}, {1, 1, 1, 1});
  }
  if (plan->padding || key.causal) neg_inf = g.scalar(kNegInf);
  const TensorRef* mq = plan->padding ? &seq_q : nullptr;
  const TensorRef* mkv = plan->padding ? &seq_kv : nullptr;

  // Delta = rowsum(dO * O) (times 1: no dropout), a non-virtual fp32 tensor.
  const TensorRef prod = g.virt(CUDNN_DATA_FLOAT, x.q_dims(), {x.h * x.s * x.d, x.s * x.d, x.h * x.d, 1});
  g.pointwise_into(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, &o, nullptr, prod);
  const TensorRef rowsum = g.virt(CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(false));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  const TensorRef softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(ragged),
                                         false, false, ragged ? &off.stats : nullptr);
  g.pointwise_into(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rowsum, &one, nullptr, softmax_sum);
  plan->softmax_sum_per_token = x.h * 4;

  // P = exp(scale Q K^T - Stats), masked.
  TensorRef s = g.virt(CUDNN_DATA_FLOAT, x.score_dims(), x.score_strides());
  g.matmul(q, kt, s, mq, mkv);
  s = g.pointwise(CUDNN_POINTWISE_MUL, s, &scale);
  if (plan->padding) s = padding_mask(g, s, seq_q, seq_kv, neg_inf);
  s = g.pointwise(CUDNN_POINTWISE_SUB, s, &stats);
  if (key.causal) s = causal_mask(g, s, neg_inf);
  const TensorRef p = g.pointwise(CUDNN_POINTWISE_EXP, s);

  // dV = P^T dO (GQA: full-head, then summed over the group).
  const TensorRef pt = g.virt(CUDNN_DATA_BFLOAT16, {x.b, x.h, x.s, x.s}, x.score_t_strides());
  g.reshape(p, pt);
  auto full_head = [&](int64_t uid, const TensorRef& reduced, int64_t* per_token) {
    if (!ragged) return g.virt(CUDNN_DATA_BFLOAT16, x.q_dims(), {x.h * x.s * x.d, x.s * x.d, x.d, 1});
    // Ragged: a non-virtual tensor on the reduced tensor's offsets (cuDNN scales them by the
    // group, the frontend's "implicit multiplier"); sized as the frontend sizes it.
    Dims strides = reduced.strides;
    strides[0] *= group;
    strides[2] *= group;
    *per_token = strides[2] * 4;
    return g.tensor(uid, CUDNN_DATA_BFLOAT16, x.q_dims(), strides, false, false,
                    uid == kDkFull ? &off.k : &off.v);
  };
  if (!gqa) {
    g.matmul(pt, dout, dv, mkv, nullptr, mq);
  } else {
    const TensorRef dv_full = full_head(kDvFull, dv, &plan->dv_full_per_token);
    g.matmul(pt, dout, dv_full, mkv, nullptr, mq);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  }

  // dS = P (dO V^T - Delta) scale.
  TensorRef dp = g.virt(CUDNN_DATA_FLOAT, x.score_dims(), x.score_strides());
  g.matmul(dout, vt, dp, mq, mkv);
  dp = g.pointwise(CUDNN_POINTWISE_SUB, dp, &softmax_sum);
  dp = g.pointwise(CUDNN_POINTWISE_MUL, dp, &p);
  const TensorRef ds = g.pointwise(CUDNN_POINTWISE_MUL, dp, &scale);

  // dK = dS^T Q.
  const TensorRef dst = g.virt(CUDNN_DATA_BFLOAT16, {x.b, x.h, x.s, x.s}, x.score_t_strides());
  g.reshape(ds, dst);
  if (!gqa) {
    g.matmul(dst, q, dk, mkv, nullptr, mq);
  } else {
    const TensorRef dk_full = full_head(kDkFull, dk, &plan->dk_full_per_token);
    g.matmul(dst, q, dk_full, mkv, nullptr, mq);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  }

  // dQ = dS K, with K^T viewed back as K (a virtual reshape, as the frontend does).
  const TensorRef k = g.virt(CUDNN_DATA_FLOAT, x.kv_dims(), x.kv_strides(), ragged ? &off.k : nullptr);
  g.reshape(kt, k);
  if (key.deterministic) {
    g.matmul(ds, k, dq, mq, nullptr, mkv);
  } else {
    const Dims acc_strides = ragged ? x.q_strides() : Dims{x.h * x.s * x.d, x.s * x.d, x.d, 1};
    const TensorRef dq_accum = g.tensor(kDqAccum, CUDNN_DATA_FLOAT, x.q_dims(), acc_strides, false, false,
                                        ragged ? &off.q : nullptr);
    plan->dq_accum_per_token = (ragged ? x.row_q : x.h * x.d) * 4;
    g.matmul(ds, k, dq_accum, mq, nullptr, mkv);
    g.pointwise_into(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq);
  }
  g.build_plan(key.deterministic, autotune_candidates(key));
  if (plan->padding && !ragged) {
    // Full lengths for the workaround's padding mask, for the life of the plan.
    std::vector<int32_t> lengths(static_cast<size_t>(x.b), static_cast<int32_t>(x.s));
    MDLM_CUDA_CHECK(cudaMalloc(&plan->constant_seq_len, lengths.size() * sizeof(int32_t)));
    MDLM_CUDA_CHECK(cudaMemcpy(plan->constant_seq_len, lengths.data(), lengths.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
  }
  return plan;
}

// ---- calls ----------------------------------------------------------------------------------

/// The ragged batch of a packed call: document count and bucket, and the device tensors the
/// graph reads (kept alive until the call's work is queued; freed stream-ordered).
struct Documents {
  int64_t count = 0, bucket = 0;
  Tensor starts_host_derived;  ///< when the caller gave no document_starts
  Tensor seq_len;              ///< i32 [bucket]
  Tensor offsets;              ///< i64 [4, row]: q, k/v, o, statistics (row >= bucket + 1, even)
  int64_t row() const { return (bucket + 2) / 2 * 2; }  // keeps every row 16-byte aligned
  int64_t* q_off() const { return static_cast<int64_t*>(offsets.data_ptr()); }
  int64_t* kv_off() const { return q_off() + row(); }
  int64_t* o_off() const { return q_off() + 2 * row(); }
  int64_t* stats_off() const { return q_off() + 3 * row(); }
};

int64_t bucket_for(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

/// How many documents the call has (host-side), without building anything.
int64_t document_count(const AttentionArgs& a, const Stream& stream, Tensor* derived) {
  if (a.document_starts != nullptr) return a.document_starts->numel() - 1;
  // Derive the starts from document_ids on the host: one synchronisation.
  const std::vector<int32_t> ids = a.document_ids->to_ints(stream);
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t i = 0; i < a.seq; ++i) {
      const int64_t t = b * a.seq + i;
      if (i == 0 || ids[static_cast<size_t>(t)] != ids[static_cast<size_t>(t - 1)])
        starts.push_back(static_cast<int32_t>(t));
    }
  starts.push_back(static_cast<int32_t>(a.batch * a.seq));
  *derived = Tensor::from_ints(starts, {static_cast<int64_t>(starts.size())}).to(stream.device(), stream);
  return static_cast<int64_t>(starts.size()) - 1;
}

void prepare_documents(const AttentionArgs& a, const Key& key, Documents& docs, const Stream& stream) {
  const Tensor& starts = a.document_starts != nullptr ? *a.document_starts : docs.starts_host_derived;
  docs.seq_len = Tensor::empty({docs.bucket}, DType::I32, stream);
  docs.offsets = Tensor::empty({4, docs.row()}, DType::I64, stream);
  cudnn_prep::launch_ragged_layout(
      static_cast<const int32_t*>(starts.data_ptr()), docs.count, docs.bucket,
      {key.row_q, key.row_kv, a.num_heads * a.head_dim, a.num_heads, thd_statistics() ? 0 : a.seq},
      static_cast<int32_t*>(docs.seq_len.data_ptr()), docs.q_off(), docs.kv_off(), docs.o_off(),
      docs.stats_off(), megadlm::detail::native_stream(stream));
}

/// Where q, k, v (or dq, dk, dv) live: separate [B, S, H, D] tensors, or the columns of one
/// packed [B, S, (Hq + 2 Hkv) D] buffer.
struct QkvPointers {
  void* q;
  void* k;
  void* v;
  int64_t row_q, row_kv;
};

QkvPointers separate(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a) {
  return {q.data_ptr(), k.data_ptr(), v.data_ptr(), a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim};
}

/// q and k from the packed buffer qk_rows, v from the value columns of v_rows (a buffer of the
/// same layout, so one token stride serves k and v).
QkvPointers packed(const Tensor& qk_rows, const Tensor& v_rows, const AttentionArgs& a) {
  char* base = static_cast<char*>(qk_rows.data_ptr());
  char* v_base = static_cast<char*>(v_rows.data_ptr());
  const int64_t hd = a.num_heads * a.head_dim, kd = a.num_kv_heads * a.head_dim;
  return {base, base + hd * 2, v_base + (hd + kd) * 2, hd + 2 * kd, hd + 2 * kd};
}

Key key_of(const AttentionArgs& a, bool backward, int device, int64_t bucket, const QkvPointers& p) {
  const bool padded = attention_row_padded(a, backward), ragged = attention_ragged_documents(a, backward);
  return {device, backward, ragged ? bucket : a.batch, a.num_heads, a.num_kv_heads, a.seq, a.head_dim,
          p.row_q, p.row_kv, a.mask == AttentionMask::Causal, ragged, backward && a.deterministic, padded};
}

/// The cached plan of a key, building it on first use; null (with the reason) if refused.
std::shared_ptr<Plan> plan_for(const Key& key, std::string* refusal) {
  Cache& c = cache();
  if (auto it = c.refused.find(key); it != c.refused.end()) {
    *refusal = it->second;
    return nullptr;
  }
  if (auto it = c.plans.find(key); it != c.plans.end()) return it->second;
  try {
    const cudnnHandle_t h = handle_for(key.device);
    std::shared_ptr<Plan> plan = key.backward ? build_backward(h, key) : build_forward(h, key);
    c.plans.emplace(key, plan);
    return plan;
  } catch (const Refused& e) {
    *refusal = e.what();
    c.refused.emplace(key, *refusal);
    return nullptr;
  }
}

/// Scratch for one call: cuDNN's workspace plus the graph's non-virtual scratch tensors, each
/// 256-byte aligned, from the stream-ordered pool.
struct Scratch {
  Tensor buffer;
  char* base = nullptr;
  int64_t used = 0;
  void* take(int64_t bytes) {
    if (bytes <= 0) return nullptr;
    void* p = base + used;
    used += (bytes + 255) / 256 * 256;
    return p;
  }
};

Scratch make_scratch(const Plan& plan, int64_t tokens, int64_t extra_bytes, const Stream& stream) {
  auto round = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t total = round(plan.graph->workspace_bytes()) +
                        round(plan.softmax_sum_per_token * tokens) +
                        round(plan.dq_accum_per_token * tokens) +
                        round(plan.dk_full_per_token * tokens) +
                        round(plan.dv_full_per_token * tokens) + round(extra_bytes);
  Scratch s;
  if (total > 0) {
    s.buffer = Tensor::empty({(total + 7) / 8}, DType::I64, stream);
    s.base = static_cast<char*>(s.buffer.data_ptr());
  }
  return s;
}

/// Queues the plan's chosen engine; throws Refused on failure.
void execute_chosen(const Plan& plan, const std::vector<std::pair<int64_t, void*>>& pack, void* workspace,
                    const Stream& stream) {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : pack) {
    uids.push_back(uid);
    ptrs.push_back(ptr);
  }
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size()));
  vp.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), static_cast<int64_t>(ptrs.size()));
  vp.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
  vp.finalize("variant pack");
  const cudnnHandle_t h = plan.graph->handle();
  check(cudnnSetStream(h, megadlm::detail::native_stream(stream)), "cudnnSetStream");
  check(cudnnBackendExecute(h, plan.graph->plan(), vp.get()), "cudnnBackendExecute");
}

/// Times every candidate plan of a key on its first call (2 warm-up + 5 timed runs each; the
/// outputs are overwritten by the call itself afterwards) and keeps the fastest; reports the
/// times once on stderr. Nothing to do with one candidate.
void autotune(const Key& key, Plan& plan, const std::vector<std::pair<int64_t, void*>>& pack, void* workspace,
              const Stream& stream) {
  if (plan.tuned || plan.graph->candidates() <= 1) return;
  plan.tuned = true;
  const cudaStream_t st = megadlm::detail::native_stream(stream);
  cudaEvent_t start, stop;
  MDLM_CUDA_CHECK(cudaEventCreate(&start));
  MDLM_CUDA_CHECK(cudaEventCreate(&stop));
  std::string report;
  float best_ms = 0.0f;
  size_t best = 0;
  for (size_t i = 0; i < plan.graph->candidates(); ++i) {
    plan.graph->choose(i);
    float ms = -1.0f;
    try {
      for (int r = 0; r < 2; ++r) execute_chosen(plan, pack, workspace, stream);
      MDLM_CUDA_CHECK(cudaEventRecord(start, st));
      for (int r = 0; r < 5; ++r) execute_chosen(plan, pack, workspace, stream);
      MDLM_CUDA_CHECK(cudaEventRecord(stop, st));
      MDLM_CUDA_CHECK(cudaEventSynchronize(stop));
      MDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      ms /= 5.0f;
    } catch (const Refused&) {
      ms = -1.0f;  // this engine does not run the call: never chosen
    }
    report += megadlm::detail::concat(i ? ", " : "", plan.graph->label(), " ",
                                      ms < 0 ? std::string("refused") : std::to_string(ms) + " ms");
    if (ms >= 0 && (best_ms == 0.0f || ms < best_ms)) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  plan.graph->choose(best);
  std::fprintf(stderr, "megadlm: cuDNN autotune (%s b %lld h %lld/%lld s %lld d %lld%s%s): %s -> %s\n",
               key.backward ? "backward" : "forward", static_cast<long long>(key.b), static_cast<long long>(key.h),
               static_cast<long long>(key.hk), static_cast<long long>(key.s), static_cast<long long>(key.d),
               key.causal ? " causal" : "", key.ragged ? " ragged" : "", report.c_str(),
               plan.graph->label().c_str());
}

/// Queues the plan (autotuned first when enabled); a failure (nothing queued) is returned as
/// the reason and refuses the key.
std::string execute(const Key& key, Plan& plan, const std::vector<std::pair<int64_t, void*>>& pack,
                    void* workspace, const Stream& stream) try {
  autotune(key, plan, pack, workspace, stream);
  execute_chosen(plan, pack, workspace, stream);
  return {};
} catch (const Refused& e) {
  cache().plans.erase(key);
  cache().refused.emplace(key, e.what());
  return e.what();
}

bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace

std::string cudnn_attention_version() {
  const int64_t v = runtime_version();
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

int64_t cudnn_runtime_version() { return runtime_version(); }

std::string cudnn_attention_unsupported(const AttentionArgs& a, bool backward) {
  return attention_cudnn_refusal(a, backward, runtime_version());
}

namespace {

CudnnRun run_forward(const QkvPointers& in, Tensor& out, Tensor& lse, const AttentionArgs& a,
                     const Stream& stream) {
  CudnnRun run;
  run.refusal = cudnn_attention_unsupported(a, false);
  if (!run.refusal.empty()) return run;
  if (!aligned16({in.q, in.k, in.v, out.data_ptr()})) {
    run.refusal = "a tensor is not 16-byte aligned";
    return run;
  }
  NvtxRange range("attention_forward_cudnn");
  Documents docs;
  const bool ragged = attention_ragged_documents(a, false);
  if (ragged) {
    docs.count = document_count(a, stream, &docs.starts_host_derived);
    docs.bucket = bucket_for(docs.count);
  }
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const Key key = key_of(a, false, stream.cuda_resources()->device, docs.bucket, in);
  const std::shared_ptr<Plan> plan = plan_for(key, &run.refusal);
  if (!plan) return run;
  const bool convert_stats = ragged && thd_statistics();
  const int64_t stats_bytes = convert_stats ? a.batch * a.seq * a.num_heads * 4 : 0;
  const int64_t tokens = a.batch * a.seq;
  Scratch scratch = make_scratch(*plan, tokens, stats_bytes, stream);
  void* workspace = scratch.take(plan->graph->workspace_bytes());
  float* stats_thd = static_cast<float*>(scratch.take(stats_bytes));
  const float scale = a.softmax_scale, neg_inf = -INFINITY;
  std::vector<std::pair<int64_t, void*>> pack = {
      {kQ, in.q}, {kK, in.k}, {kV, in.v}, {kO, out.data_ptr()},
      {kStats, convert_stats ? static_cast<void*>(stats_thd) : lse.data_ptr()},
      {kScale, const_cast<float*>(&scale)}};
  if (plan->padding || key.causal) pack.emplace_back(kNegInf, const_cast<float*>(&neg_inf));
  if (ragged) {
    prepare_documents(a, key, docs, stream);
    pack.insert(pack.end(), {{kSeqQ, docs.seq_len.data_ptr()}, {kSeqKv, docs.seq_len.data_ptr()},
                             {kOffQ, docs.q_off()}, {kOffO, docs.o_off()}, {kOffK, docs.kv_off()},
                             {kOffV, docs.kv_off()}, {kOffStats, docs.stats_off()}});
  } else if (key.row_padding) {
    void* lengths = a.row_lengths->data_ptr();
    pack.insert(pack.end(), {{kSeqQ, lengths}, {kSeqKv, lengths}});
  }
  run.refusal = execute(key, *plan, pack, workspace, stream);
  if (!run.refusal.empty()) return run;
  if (convert_stats)
    cudnn_prep::launch_lse_from_thd(stats_thd, static_cast<float*>(lse.data_ptr()), a.batch,
                                    a.num_heads, a.seq, megadlm::detail::native_stream(stream));
  run.ran = true;
  return run;
}

CudnnRun run_backward(const Tensor& dout, const QkvPointers& in, const Tensor& out,
                      const Tensor& lse, const QkvPointers& grad, const AttentionArgs& a,
                      const Stream& stream) {
  CudnnRun run;
  run.refusal = cudnn_attention_unsupported(a, true);
  if (!run.refusal.empty()) return run;
  if (!aligned16({dout.data_ptr(), in.q, in.k, in.v, out.data_ptr(), grad.q, grad.k, grad.v})) {
    run.refusal = "a tensor is not 16-byte aligned";
    return run;
  }
  NvtxRange range("attention_backward_cudnn");
  Documents docs;
  const bool ragged = attention_ragged_documents(a, true);
  if (ragged) {
    docs.count = document_count(a, stream, &docs.starts_host_derived);
    docs.bucket = bucket_for(docs.count);
  }
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const Key key = key_of(a, true, stream.cuda_resources()->device, docs.bucket, in);
  const std::shared_ptr<Plan> plan = plan_for(key, &run.refusal);
  if (!plan) return run;
  const bool convert_stats = ragged && thd_statistics();
  const int64_t stats_bytes = convert_stats ? a.batch * a.seq * a.num_heads * 4 : 0;
  const int64_t tokens = a.batch * a.seq;
  Scratch scratch = make_scratch(*plan, tokens, stats_bytes, stream);
  void* workspace = scratch.take(plan->graph->workspace_bytes());
  void* softmax_sum = scratch.take(plan->softmax_sum_per_token * tokens);
  void* dq_accum = scratch.take(plan->dq_accum_per_token * tokens);
  void* dk_full = scratch.take(plan->dk_full_per_token * tokens);
  void* dv_full = scratch.take(plan->dv_full_per_token * tokens);
  float* stats_thd = static_cast<float*>(scratch.take(stats_bytes));
  const cudaStream_t st = megadlm::detail::native_stream(stream);
  if (convert_stats)
    cudnn_prep::launch_lse_to_thd(static_cast<const float*>(lse.data_ptr()), stats_thd, a.batch,
                                  a.num_heads, a.seq, st);
  const float scale = a.softmax_scale, neg_inf = -INFINITY, one = 1.0f;
  std::vector<std::pair<int64_t, void*>> pack = {
      {kQ, in.q}, {kK, in.k}, {kV, in.v}, {kO, out.data_ptr()}, {kDout, dout.data_ptr()},
      {kDq, grad.q}, {kDk, grad.k}, {kDv, grad.v},
      {kStats, convert_stats ? static_cast<void*>(stats_thd) : lse.data_ptr()},
      {kScale, const_cast<float*>(&scale)}, {kOne, const_cast<float*>(&one)},
      {kSoftmaxSum, softmax_sum}};
  if (plan->padding || key.causal) pack.emplace_back(kNegInf, const_cast<float*>(&neg_inf));
  if (dq_accum != nullptr) pack.emplace_back(kDqAccum, dq_accum);
  if (dk_full != nullptr) pack.emplace_back(kDkFull, dk_full);
  if (dv_full != nullptr) pack.emplace_back(kDvFull, dv_full);
  if (ragged) {
    prepare_documents(a, key, docs, stream);
    pack.insert(pack.end(), {{kSeqQ, docs.seq_len.data_ptr()}, {kSeqKv, docs.seq_len.data_ptr()},
                             {kOffQ, docs.q_off()}, {kOffO, docs.o_off()}, {kOffK, docs.kv_off()},
                             {kOffV, docs.kv_off()}, {kOffStats, docs.stats_off()}});
  } else if (plan->padding) {
    pack.insert(pack.end(), {{kSeqQ, plan->constant_seq_len}, {kSeqKv, plan->constant_seq_len}});
  }
  run.refusal = execute(key, *plan, pack, workspace, stream);
  run.ran = run.refusal.empty();
  return run;
}

}  // namespace

CudnnRun cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                 Tensor& lse, const AttentionArgs& a, const Stream& stream) {
  return run_forward(separate(q, k, v, a), out, lse, a, stream);
}

CudnnRun cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& a,
                                  const Stream& stream) {
  return run_backward(dout, separate(q, k, v, a), out, lse, separate(dq, dk, dv, a), a, stream);
}

CudnnRun cudnn_attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out,
                                        Tensor& lse, const AttentionArgs& a, const Stream& stream) {
  if (std::string why = attention_cudnn_packed_refusal(a, false); !why.empty()) return {false, why};
  return run_forward(packed(qk_rows, v_rows, a), out, lse, a, stream);
}

CudnnRun cudnn_attention_backward_packed(const Tensor& dout, const Tensor& qk_rows,
                                         const Tensor& v_rows, const Tensor& out, const Tensor& lse,
                                         Tensor& dqkv, const AttentionArgs& a, const Stream& stream) {
  if (std::string why = attention_cudnn_packed_refusal(a, true); !why.empty()) return {false, why};
  return run_backward(dout, packed(qk_rows, v_rows, a), out, lse, packed(dqkv, dqkv, a), a, stream);
}

}  // namespace megadlm::ops::cuda

#else  // cuDNN not found at configure time: every call is refused with the reason.

namespace megadlm::ops::cuda {

std::string cudnn_attention_version() { return "cuDNN (not built: cudnn_graph.h not found)"; }

int64_t cudnn_runtime_version() { return 0; }

std::string cudnn_attention_unsupported(const AttentionArgs& a, bool backward) {
  return attention_cudnn_refusal(a, backward, 0);
}

CudnnRun cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                                 const AttentionArgs& a, const Stream&) {
  return {false, cudnn_attention_unsupported(a, false)};
}

CudnnRun cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                                  const AttentionArgs& a, const Stream&) {
  return {false, cudnn_attention_unsupported(a, true)};
}

CudnnRun cudnn_attention_forward_packed(const Tensor&, const Tensor&, Tensor&, Tensor&,
                                        const AttentionArgs& a, const Stream&) {
  return {false, cudnn_attention_unsupported(a, false)};
}

CudnnRun cudnn_attention_backward_packed(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, Tensor&, const AttentionArgs& a, const Stream&) {
  return {false, cudnn_attention_unsupported(a, true)};
}

}  // namespace megadlm::ops::cuda

#endif
