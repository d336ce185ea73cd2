// The cuDNN backend-graph layer (contract in cudnn_graph.h).
#if MEGADLM_WITH_CUDNN
#include "ops/cuda/cudnn_graph.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include "core/cuda/cuda_utils.h"

// The operation-graph and execution-plan HANDLE attributes are deprecated in the 9.19 headers
// but still what the frontend sets (and 9.14 expects).
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace megadlm::ops::cuda::cudnn {
namespace {

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

}  // namespace

void check(cudnnStatus_t st, const char* what) {
  if (st == CUDNN_STATUS_SUCCESS) return;
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  throw Refused(std::string(what) + ": " + cudnnGetErrorString(st) + (last[0] ? std::string(" (") + last + ")" : ""));
}

int64_t runtime_version() { return static_cast<int64_t>(cudnnGetVersion()); }

// ---- the graph ------------------------------------------------------------------------------

TensorRef Graph::tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                        bool is_virtual, bool by_value, const TensorRef* ragged) {
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

void Graph::pointwise_into(cudnnPointwiseMode_t mode, cudnnDataType_t compute, const TensorRef& x,
                           const TensorRef* b, const TensorRef* t, const TensorRef& y, int64_t axis) {
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

void Graph::matmul(const TensorRef& a, const TensorRef& b, const TensorRef& c,
                   const TensorRef* m_override, const TensorRef* n_override,
                   const TensorRef* k_override) {
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

void Graph::reduction(cudnnReduceTensorOp_t reduce, const TensorRef& x, const TensorRef& y) {
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

void Graph::reshape(const TensorRef& x, const TensorRef& y) {
  Desc& op = add(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x.desc);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y.desc);
  op.finalize("reshape operation");
  ops_.push_back(op.get());
}

void Graph::build_plan(bool deterministic, int candidates) {
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
  if (count <= 0) throw Refused("cuDNN's heuristics offer no engine for this graph");
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i) configs.push_back(add(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
  int64_t returned = 0;
  check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, configs.data()),
        "engine heuristics results");
  // (configuration, label) in the order they are tried: the heuristics' list, or with
  // MEGADLM_CUDNN_KNOBS its engines' knob variants.
  Tries tries;
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

/// The global index of a configuration's engine, and the engine's knobs with the values the
/// configuration chose.
int64_t Graph::engine_knobs(cudnnBackendDescriptor_t config, std::vector<Knob>& knobs) {
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
cudnnBackendDescriptor_t Graph::config_with(cudnnBackendDescriptor_t graph_desc, int64_t index,
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
Graph::Tries Graph::knob_variants(cudnnBackendDescriptor_t graph_desc, const Tries& base) {
  Tries out;
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

bool Graph::is_nondeterministic(cudnnBackendDescriptor_t config) {
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

// ---- handles, plans, launches ---------------------------------------------------------------

cudnnHandle_t handle_for(int device) {
  static std::mutex mutex;
  static auto* handles = new std::map<int, cudnnHandle_t>();  // never destroyed: for the process
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  int current = 0;
  MDLM_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) MDLM_CUDA_CHECK(cudaSetDevice(device));
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t st = cudnnCreate(&h);
  if (current != device) MDLM_CUDA_CHECK(cudaSetDevice(current));
  check(st, "cudnnCreate");
  handles->emplace(device, h);
  return h;
}

int autotune_candidates(bool deterministic) {
  static const int n = [] {
    const char* v = std::getenv("MEGADLM_CUDNN_AUTOTUNE");
    if (v == nullptr || *v == 0) return 1;
    const int k = std::atoi(v);
    return k == 1 ? 6 : std::max(1, std::min(k, 16));
  }();
  return deterministic ? 1 : n;
}

void execute(const Graph& graph, const VariantPack& pack, void* workspace, const Stream& stream) {
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
  const cudnnHandle_t h = graph.handle();
  check(cudnnSetStream(h, megadlm::detail::native_stream(stream)), "cudnnSetStream");
  check(cudnnBackendExecute(h, graph.plan(), vp.get()), "cudnnBackendExecute");
}

void autotune(Graph& graph, const VariantPack& pack, void* workspace, const Stream& stream,
              const std::string& what) {
  if (graph.tuned() || graph.candidates() <= 1) return;
  graph.set_tuned();
  const cudaStream_t st = megadlm::detail::native_stream(stream);
  cudaEvent_t start, stop;
  MDLM_CUDA_CHECK(cudaEventCreate(&start));
  MDLM_CUDA_CHECK(cudaEventCreate(&stop));
  std::string report;
  float best_ms = 0.0f;
  size_t best = 0;
  for (size_t i = 0; i < graph.candidates(); ++i) {
    graph.choose(i);
    float ms = -1.0f;
    try {
      for (int r = 0; r < 2; ++r) execute(graph, pack, workspace, stream);
      MDLM_CUDA_CHECK(cudaEventRecord(start, st));
      for (int r = 0; r < 5; ++r) execute(graph, pack, workspace, stream);
      MDLM_CUDA_CHECK(cudaEventRecord(stop, st));
      MDLM_CUDA_CHECK(cudaEventSynchronize(stop));
      MDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      ms /= 5.0f;
    } catch (const Refused&) {
      ms = -1.0f;  // this engine does not run the call: never chosen
    }
    report += megadlm::detail::concat(i ? ", " : "", graph.label(), " ",
                                      ms < 0 ? std::string("refused") : std::to_string(ms) + " ms");
    if (ms >= 0 && (best_ms == 0.0f || ms < best_ms)) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  graph.choose(best);
  std::fprintf(stderr, "megadlm: cuDNN autotune (%s): %s -> %s\n", what.c_str(), report.c_str(),
               graph.label().c_str());
}

}  // namespace megadlm::ops::cuda::cudnn

#endif  // MEGADLM_WITH_CUDNN
