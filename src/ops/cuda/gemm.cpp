// Matrix products on CUDA through cuBLASLt (host code only; kernels it needs live elsewhere).
//
// Row-major to column-major: a row-major X[r, c] is, byte for byte, the column-major X^T[c, r].
// So C[M,N] = op(A)[M,K] op(B)[K,N] is computed as the column-major product
//   C^T[N,M] = op(B)^T[N,K] * op(A)^T[K,M]
// i.e. cuBLASLt's "A" is our B and its "B" is our A, each described as the column-major matrix
// its bytes already are, and its D (column-major N x M, ld N) is our row-major C.
//
// Precision: bf16 x bf16 -> bf16 or f32 C, and f32 x f32 -> f32, all with CUBLAS_COMPUTE_32F
// (fp32 accumulation; for f32 inputs this also keeps TF32 off). alpha/beta are f32 scalars on
// the host. Bias: cuBLASLt's bias epilogue (bias of C's dtype); if no algorithm supports it for
// a combination, the product runs without it and launch_add_row_bias adds the bias after.
//
// Heuristic results are cached per (device, shape, transposes, dtypes, pointer alignments, bias)
// in a file-local map guarded by a mutex: the one piece of global state in the CUDA backend.
// A shape whose M or K is new (the masked rows of the LM head vary per micro-batch, the sampler's
// query rows per step) first tries the algorithm of its size bucket (heuristic_bucket): one
// heuristic call per bucket instead of per size, each costing milliseconds of idle GPU.
//
// Batch-invariant mode (ops::batch_invariant(), generate_difflm --batch-invariant): a row of C
// must get the same bits whatever M it is computed with. A cuBLASLt algorithm fixes the kernel,
// its tile and its split-K count, so each output element's K reduction is the same for every M
// once the algorithm is; what varies with M is the heuristic's choice (other tiles, split-K or
// its reductions for small M). So the algorithm is asked for once per (N, K, transposes, dtypes,
// alignments, bias) at M = kInvariantM with split-K reductions excluded
// (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = NONE, and any candidate whose
// CUBLASLT_ALGO_CONFIG_SPLITK_NUM > 1 skipped), and every M runs it after
// cublasLtMatmulAlgoCheck accepts it; a refusal is an error, never a quiet per-M choice.
// Keys: ops/gemm_algo_key.h (the `invariant` bit keeps the two modes apart).
#include <cublasLt.h>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <cstdlib>
#include "core/cuda/cuda_utils.h"
#include "megadlm/ops/gemm.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

// ---- RAII for the cuBLASLt descriptors (released even when a check throws) ----------------

struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  MatmulDesc() { MDLM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <typename V>
  void set(cublasLtMatmulDescAttributes_t attr, const V& value) {
    MDLM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  }
};

struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    MDLM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                 static_cast<uint64_t>(cols), ld));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference() { MDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <typename V>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const V& value) {
    MDLM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  }
};

// ---- heuristic cache ----------------------------------------------------------------------

using detail::AlgoKey;
using detail::AlgoKeyHash;
using detail::heuristic_key;

struct CachedAlgo {
  cublasLtMatmulAlgo_t algo;
  bool bias_in_epilogue;  ///< false: the bias is added by launch_add_row_bias after the product
};

/// Shapes seen in one training run are few (one per distinct linear layer and direction), so the
/// map stays small; it lives for the process.
std::mutex g_algo_cache_mutex;
std::unordered_map<AlgoKey, CachedAlgo, AlgoKeyHash> g_algo_cache;
/// The heuristic's choice for each size bucket (heuristic_bucket), keyed with the bucket's M, K.
std::unordered_map<AlgoKey, CachedAlgo, AlgoKeyHash> g_bucket_cache;

/// The algorithm `cache` holds for `key`, under the caches' lock.
bool find_cached(const std::unordered_map<AlgoKey, CachedAlgo, AlgoKeyHash>& cache, const AlgoKey& key,
                 CachedAlgo& out) {
  std::lock_guard<std::mutex> lock(g_algo_cache_mutex);
  auto it = cache.find(key);
  if (it == cache.end()) return false;
  out = it->second;
  return true;
}

cudaDataType_t lt_type(DType d) {
  switch (d) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    default: MDLM_FAIL("gemm: CUDA gemm takes bf16 or f32 operands, got ", dtype_name(d));
  }
}

/// Everything one cublasLtMatmul call needs, built from the row-major problem.
struct LtProblem {
  MatmulDesc desc;
  Layout lt_a;  // our B
  Layout lt_b;  // our A
  Layout lt_c;  // our C (also D)
  LtProblem(cudaDataType_t ab, cudaDataType_t c, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b)
      : lt_a(ab, trans_b ? k : n, trans_b ? n : k, trans_b ? k : n),
        lt_b(ab, trans_a ? m : k, trans_a ? k : m, trans_a ? m : k),
        lt_c(c, n, m, n) {
    const int32_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int32_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  }
  void set_bias(const void* bias) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(bias ? CUBLASLT_EPILOGUE_BIAS
                                                                       : CUBLASLT_EPILOGUE_DEFAULT));
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  /// Asks cuBLASLt's heuristic for its best algorithm; returns its status (NOT_SUPPORTED when
  /// it proposes none).
  cublasStatus_t heuristic(cublasLtHandle_t handle, const AlgoKey& key, size_t workspace_bytes,
                           cublasLtMatmulAlgo_t* algo) {
    std::vector<cublasLtMatmulAlgo_t> algos;
    const cublasStatus_t st = heuristics(handle, key, workspace_bytes, 1, algos);
    if (st == CUBLAS_STATUS_SUCCESS) *algo = algos[0];
    return st;
  }
  /// Up to `count` of the heuristic's algorithms, best first (at least one on success). For a
  /// batch-invariant key only algorithms without split-K: the preference excludes reduction
  /// schemes, and a candidate that still reports CUBLASLT_ALGO_CONFIG_SPLITK_NUM > 1 is skipped
  /// (several are asked for so that one remains).
  cublasStatus_t heuristics(cublasLtHandle_t handle, const AlgoKey& key, size_t workspace_bytes, int count,
                            std::vector<cublasLtMatmulAlgo_t>& algos) {
    Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_bytes));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A is our B
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    if (key.invariant)
      pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
    const int asked = key.invariant ? std::max(count, 8) : count;
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(asked));
    std::memset(results.data(), 0, results.size() * sizeof(results[0]));
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, desc.desc, lt_a.layout, lt_b.layout, lt_c.layout,
                                       lt_c.layout, pref.pref, asked, results.data(), &returned);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (returned == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    algos.clear();
    for (int i = 0; i < returned && static_cast<int>(algos.size()) < count; ++i) {
      const cublasLtMatmulHeuristicResult_t& r = results[static_cast<size_t>(i)];
      if (r.state != CUBLAS_STATUS_SUCCESS) continue;
      if (key.invariant && splits_k(r.algo)) continue;
      algos.push_back(r.algo);
    }
    return algos.empty() ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_SUCCESS;
  }
  /// Whether `algo` splits the K reduction (CUBLASLT_ALGO_CONFIG_SPLITK_NUM > 1, or a reduction
  /// scheme other than NONE); an attribute the library does not report counts as no split.
  static bool splits_k(const cublasLtMatmulAlgo_t& algo) {
    int32_t splits = 1;
    uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                             &written) != CUBLAS_STATUS_SUCCESS)
      splits = 1;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme,
                                             &written) != CUBLAS_STATUS_SUCCESS)
      scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    return splits > 1 || scheme != CUBLASLT_REDUCTION_SCHEME_NONE;
  }
  /// The fastest of `algos` on this problem, timed on the stream (one warm-up, then three
  /// runs each) into a scratch D so C keeps its contents; an algorithm that fails is skipped.
  cublasLtMatmulAlgo_t fastest(cublasLtHandle_t handle, const std::vector<cublasLtMatmulAlgo_t>& algos,
                               const void* lt_a_ptr, const void* lt_b_ptr, float beta, const Tensor& c,
                               void* workspace, size_t workspace_bytes, const Stream& stream) {
    if (algos.size() == 1) return algos[0];
    cudaStream_t s = megadlm::detail::native_stream(stream);
    Tensor scratch = Tensor::empty(c.shape(), c.dtype(), stream);
    const float alpha = 1.0f;
    cudaEvent_t start, stop;
    MDLM_CUDA_CHECK(cudaEventCreate(&start));
    MDLM_CUDA_CHECK(cudaEventCreate(&stop));
    size_t best = 0;
    float best_ms = 0;
    for (size_t i = 0; i < algos.size(); ++i) {
      auto run = [&] {
        return cublasLtMatmul(handle, desc.desc, &alpha, lt_a_ptr, lt_a.layout, lt_b_ptr, lt_b.layout, &beta,
                              scratch.data_ptr(), lt_c.layout, scratch.data_ptr(), lt_c.layout, &algos[i],
                              workspace, workspace_bytes, s);
      };
      if (run() != CUBLAS_STATUS_SUCCESS) continue;
      MDLM_CUDA_CHECK(cudaEventRecord(start, s));
      bool ok = true;
      for (int r = 0; r < 3 && ok; ++r) ok = run() == CUBLAS_STATUS_SUCCESS;
      MDLM_CUDA_CHECK(cudaEventRecord(stop, s));
      MDLM_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      MDLM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (ok && (i == 0 || ms < best_ms)) {
        best = i;
        best_ms = ms;
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return algos[best];
  }
};

/// The heuristic's choice for `problem` (bias in the epilogue when an algorithm takes it, else
/// the plain product: the caller adds the bias); with MEGADLM_GEMM_AUTOTUNE the fastest of
/// several, timed on this call's operands.
CachedAlgo choose_algo(LtProblem& problem, const AlgoKey& key, const void* bias_ptr, const Tensor& a,
                       const Tensor& b, const Tensor& c, float beta, megadlm::detail::CudaStreamResources* res, int candidates,
                       const Stream& stream) {
  CachedAlgo chosen{};
  chosen.bias_in_epilogue = false;
  if (bias_ptr) {
    // Any refusal of the epilogue (no algorithm, or an unsupported type combination) falls
    // back to the plain product plus a bias kernel.
    problem.set_bias(bias_ptr);
    chosen.bias_in_epilogue =
        problem.heuristic(res->cublaslt, key, res->workspace_bytes, &chosen.algo) == CUBLAS_STATUS_SUCCESS;
    if (!chosen.bias_in_epilogue) problem.set_bias(nullptr);
  }
  if (!chosen.bias_in_epilogue) {
    std::vector<cublasLtMatmulAlgo_t> algos;
    const cublasStatus_t st = problem.heuristics(res->cublaslt, key, res->workspace_bytes, candidates, algos);
    MDLM_CHECK(st == CUBLAS_STATUS_SUCCESS, "gemm: cuBLASLt has no algorithm for C[", key.m, ", ", key.n,
               "] = op(A) op(B) with K = ", key.k, ", A ", a.str(), " trans_a=", key.trans_a, ", B ", b.str(),
               " trans_b=", key.trans_b, ", C ", c.str(), " (", cublasLtGetStatusString(st), ")");
    chosen.algo = candidates > 1 ? problem.fastest(res->cublaslt, algos, b.data_ptr(), a.data_ptr(), beta, c,
                                                   res->workspace, res->workspace_bytes, stream)
                                 : algos[0];
  }
  return chosen;
}

/// Whether `algo` runs `problem` (its bias epilogue set as the algorithm needs) in the workspace.
bool algo_runs(LtProblem& problem, const CachedAlgo& algo, const void* bias_ptr, megadlm::detail::CudaStreamResources* res) {
  problem.set_bias(algo.bias_in_epilogue ? bias_ptr : nullptr);
  cublasLtMatmulHeuristicResult_t result;
  std::memset(&result, 0, sizeof result);
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(res->cublaslt, problem.desc.desc, problem.lt_a.layout,
                                                    problem.lt_b.layout, problem.lt_c.layout, problem.lt_c.layout,
                                                    &algo.algo, &result);
  return st == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= res->workspace_bytes;
}

/// MEGADLM_GEMM_AUTOTUNE=N (N >= 2; "1" means 8): time up to N of the heuristic's algorithms on
/// a shape's first call and keep the fastest instead of the first. Off by default: the choice
/// depends on timings, so two processes may pick different algorithms (and round differently).
int gemm_autotune_candidates() {
  static const int n = [] {
    const char* v = std::getenv("MEGADLM_GEMM_AUTOTUNE");
    if (v == nullptr || *v == 0) return 1;
    const int k = std::atoi(v);
    return k == 1 ? 8 : std::max(1, std::min(k, 32));
  }();
  return n;
}

/// The default mode's algorithm for `key` (its cache entry is new): the algorithm of its size
/// bucket (chosen on the bucket's size, once) where cuBLASLt accepts it for this size, else the
/// heuristic's (or with MEGADLM_GEMM_AUTOTUNE the fastest) for this size.
CachedAlgo default_algo(LtProblem& problem, const AlgoKey& key, const void* bias_ptr, const Tensor& a,
                        const Tensor& b, const Tensor& c, float beta, megadlm::detail::CudaStreamResources* res,
                        const Stream& stream) {
  const int candidates = gemm_autotune_candidates();
  const AlgoKey bucket = heuristic_key(key);
  if (candidates == 1 && (bucket.m != key.m || bucket.k != key.k)) {
    CachedAlgo shared{};
    bool have = find_cached(g_bucket_cache, bucket, shared);
    if (!have) {
      try {
        LtProblem sized(lt_type(key.ab), lt_type(key.c), bucket.m, key.n, bucket.k, key.trans_a, key.trans_b);
        shared = choose_algo(sized, bucket, bias_ptr, a, b, c, beta, res, 1, stream);
        have = true;
        std::lock_guard<std::mutex> lock(g_algo_cache_mutex);
        g_bucket_cache.emplace(bucket, shared);
      } catch (const std::exception&) {
        // No algorithm for the bucket's size: this size is asked about exactly below.
      }
    }
    if (have && algo_runs(problem, shared, bias_ptr, res)) return shared;
  }
  return choose_algo(problem, key, bias_ptr, a, b, c, beta, res, candidates, stream);
}

/// Batch-invariant mode's algorithm for `key`: the heuristic's first split-K-free choice at
/// M = kInvariantM (once per N, K, ...; kept in the bucket cache under its invariant key), which
/// must run this M. No autotuning (a timed choice could differ between processes) and no
/// per-M fallback (that would make the row's bits depend on M again).
CachedAlgo invariant_algo(LtProblem& problem, const AlgoKey& key, const void* bias_ptr, const Tensor& a,
                          const Tensor& b, const Tensor& c, float beta, megadlm::detail::CudaStreamResources* res,
                          const Stream& stream) {
  const AlgoKey canonical = heuristic_key(key);
  CachedAlgo shared{};
  if (!find_cached(g_bucket_cache, canonical, shared)) {
    LtProblem sized(lt_type(key.ab), lt_type(key.c), canonical.m, key.n, canonical.k, key.trans_a, key.trans_b);
    try {
      shared = choose_algo(sized, canonical, bias_ptr, a, b, c, beta, res, 1, stream);
    } catch (const std::exception& e) {
      MDLM_FAIL("gemm (--batch-invariant): no split-K-free cuBLASLt algorithm for N = ", key.n, ", K = ", key.k,
                " at M = ", canonical.m, " (the one algorithm every M of this shape would run): ", e.what(),
                "; run without --batch-invariant");
    }
    std::lock_guard<std::mutex> lock(g_algo_cache_mutex);
    g_bucket_cache.emplace(canonical, shared);
  }
  MDLM_CHECK(algo_runs(problem, shared, bias_ptr, res), "gemm (--batch-invariant): cuBLASLt's algorithm for N = ",
             key.n, ", K = ", key.k, " (chosen at M = ", canonical.m, ", no split-K) does not run C[", key.m, ", ",
             key.n, "] = op(A) op(B) with A ", a.str(), " trans_a=", key.trans_a, ", B ", b.str(), " trans_b=",
             key.trans_b, ", C ", c.str(), (key.has_bias ? ", bias" : ""),
             "; batch-invariant mode uses one algorithm for every M (run without --batch-invariant)");
  return shared;
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmArgs& args, const Stream& stream) {
  NvtxRange range("gemm");
  const int64_t m = args.trans_a ? a.cols() : a.rows();
  const int64_t k = args.trans_a ? a.rows() : a.cols();
  const int64_t n = args.trans_b ? b.rows() : b.cols();
  const cudaDataType_t ab_type = lt_type(a.dtype());
  const cudaDataType_t c_type = lt_type(c.dtype());
  MDLM_CHECK(a.dtype() == DType::BF16 || c.dtype() == DType::F32, "gemm: f32 operands need an f32 C, got ",
             c.str());
  if (m == 0 || n == 0) return;
  auto* res = stream.cuda_resources().get();
  cudaStream_t s = megadlm::detail::native_stream(stream);
  // C's input: the addend (written sum into C) or C itself.
  const void* c_in = args.addend != nullptr ? args.addend->data_ptr() : c.data_ptr();
  if (k == 0) {  // empty product: C = beta * C (+ bias); beta == 0 ignores C's old contents
    if (c_in != c.data_ptr() && args.beta != 0.0f)
      MDLM_CUDA_CHECK(cudaMemcpyAsync(c.data_ptr(), c_in, c.nbytes(), cudaMemcpyDeviceToDevice, s));
    if (args.beta == 0.0f) fill(c, 0.0f, stream);
    else if (args.beta != 1.0f) scale_inplace(c, args.beta, stream);
    if (args.bias) launch_add_row_bias(c, *args.bias, s);
    return;
  }

  const void* bias_ptr = args.bias ? args.bias->data_ptr() : nullptr;
  const AlgoKey key = detail::problem_key({res->device,
                                          m,
                                          n,
                                          k,
                                          args.trans_a,
                                          args.trans_b,
                                          args.bias != nullptr,
                                          a.dtype(),
                                          c.dtype(),
                                          pointer_alignment(a.data_ptr()),
                                          pointer_alignment(b.data_ptr()),
                                          std::min(pointer_alignment(c.data_ptr()), pointer_alignment(c_in)),
                                          pointer_alignment(bias_ptr)},
                                         ops::batch_invariant());

  LtProblem problem(ab_type, c_type, m, n, k, args.trans_a, args.trans_b);
  CachedAlgo chosen{};
  if (!find_cached(g_algo_cache, key, chosen)) {
    if (key.invariant) chosen = invariant_algo(problem, key, bias_ptr, a, b, c, args.beta, res, stream);
    else chosen = default_algo(problem, key, bias_ptr, a, b, c, args.beta, res, stream);
    std::lock_guard<std::mutex> lock(g_algo_cache_mutex);
    g_algo_cache.emplace(key, chosen);
  }
  problem.set_bias(chosen.bias_in_epilogue ? bias_ptr : nullptr);  // the pointer differs per call

  const float alpha = args.alpha, beta = args.beta;
  MDLM_CUBLAS_CHECK(cublasLtMatmul(res->cublaslt, problem.desc.desc, &alpha, b.data_ptr(),
                                   problem.lt_a.layout, a.data_ptr(), problem.lt_b.layout, &beta,
                                   c_in, problem.lt_c.layout, c.data_ptr(),
                                   problem.lt_c.layout, &chosen.algo, res->workspace,
                                   res->workspace_bytes, s));
  if (args.bias && !chosen.bias_in_epilogue) launch_add_row_bias(c, *args.bias, s);
}

// ---- grouped GEMM (MoE experts) -----------------------------------------------------------
//
// One cuBLASLt matmul per group on the caller's stream, in group order (cuBLAS's
// cublasGemmGroupedBatchedEx runs sm_80 kernels, slower on MoE shapes). A layer
// issues hundreds of these per micro-batch, so the host side must stay short: each distinct
// problem keeps its descriptors and algorithm in a plan (built once: the heuristic call), and a
// group costs one map lookup and one cublasLtMatmul. Plans hold no pointers (no bias epilogue),
// so concurrent streams can share them; groups with a bias take the plain gemm() above.

namespace {

struct GroupPlan {
  LtProblem problem;
  cublasLtMatmulAlgo_t algo;
  GroupPlan(cudaDataType_t ab, cudaDataType_t c, int64_t m, int64_t n, int64_t k, bool ta, bool tb)
      : problem(ab, c, m, n, k, ta, tb) {}
};

std::mutex g_plan_mutex;
std::unordered_map<AlgoKey, std::unique_ptr<GroupPlan>, AlgoKeyHash> g_plans;

/// C[m, n] = alpha * op(A) op(B) + beta * C (no bias) through the cached plan of its shape.
void planned_gemm(const Tensor& a, const Tensor& b, Tensor& c, int64_t m, int64_t n, int64_t k,
                  bool ta, bool tb, float alpha, float beta, const Stream& stream) {
  auto* res = stream.cuda_resources().get();
  // Batch-invariant mode: the group's rows (the tokens routed to its expert) depend on the rest
  // of the batch, so the plan runs the algorithm chosen at M = kInvariantM, as gemm() does.
  const AlgoKey key = detail::problem_key({res->device, m, n, k, ta, tb, false, a.dtype(), c.dtype(),
                                           pointer_alignment(a.data_ptr()), pointer_alignment(b.data_ptr()),
                                           pointer_alignment(c.data_ptr()), 256},
                                          ops::batch_invariant());
  GroupPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    auto it = g_plans.find(key);
    if (it != g_plans.end()) plan = it->second.get();
  }
  if (plan == nullptr) {
    auto fresh = std::make_unique<GroupPlan>(lt_type(a.dtype()), lt_type(c.dtype()), m, n, k, ta, tb);
    fresh->problem.set_bias(nullptr);
    if (key.invariant) {
      const AlgoKey canonical = heuristic_key(key);
      CachedAlgo shared{};
      if (!find_cached(g_bucket_cache, canonical, shared)) {
        LtProblem sized(lt_type(a.dtype()), lt_type(c.dtype()), canonical.m, n, canonical.k, ta, tb);
        sized.set_bias(nullptr);
        const cublasStatus_t st = sized.heuristic(res->cublaslt, canonical, res->workspace_bytes, &shared.algo);
        MDLM_CHECK(st == CUBLAS_STATUS_SUCCESS, "grouped_gemm (--batch-invariant): cuBLASLt has no split-K-free "
                   "algorithm for N = ", n, ", K = ", k, " at M = ", canonical.m, " (", cublasLtGetStatusString(st), ")");
        shared.bias_in_epilogue = false;
        std::lock_guard<std::mutex> lock(g_algo_cache_mutex);
        g_bucket_cache.emplace(canonical, shared);
      }
      MDLM_CHECK(algo_runs(fresh->problem, shared, nullptr, res), "grouped_gemm (--batch-invariant): cuBLASLt's "
                 "algorithm for N = ", n, ", K = ", k, " (chosen at M = ", canonical.m, ", no split-K) does not run M = ",
                 m, "; batch-invariant mode uses one algorithm for every M (run without --batch-invariant)");
      fresh->algo = shared.algo;
    } else {
      const cublasStatus_t st = fresh->problem.heuristic(res->cublaslt, key, res->workspace_bytes, &fresh->algo);
      MDLM_CHECK(st == CUBLAS_STATUS_SUCCESS, "grouped_gemm: cuBLASLt has no algorithm for C[", m, ", ", n,
                 "] with K = ", k, " (", cublasLtGetStatusString(st), ")");
    }
    std::lock_guard<std::mutex> lock(g_plan_mutex);
    plan = g_plans.emplace(key, std::move(fresh)).first->second.get();  // a racing twin is dropped
  }
  MDLM_CUBLAS_CHECK(cublasLtMatmul(res->cublaslt, plan->problem.desc.desc, &alpha, b.data_ptr(),
                                   plan->problem.lt_a.layout, a.data_ptr(), plan->problem.lt_b.layout, &beta,
                                   c.data_ptr(), plan->problem.lt_c.layout, c.data_ptr(),
                                   plan->problem.lt_c.layout, &plan->algo, res->workspace,
                                   res->workspace_bytes, megadlm::detail::native_stream(stream)));
}

}  // namespace

void grouped_gemm(const Tensor& a, const Tensor& b, Tensor& c, const std::vector<int64_t>& group_rows,
                  const GroupedGemmArgs& args, const Stream& stream) {
  NvtxRange range("grouped_gemm");
  MDLM_CHECK(a.dtype() == DType::BF16 || c.dtype() == DType::F32, "grouped_gemm: f32 operands need an f32 C, got ",
             c.str());
  const int64_t groups = static_cast<int64_t>(group_rows.size());
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = group_rows[static_cast<size_t>(g)];
    if (!args.trans_a) {
      // C_g [rows, n] = A_g [rows, k] op(B_g)
      const int64_t b_rows = b.rows() / groups;
      if (rows > 0) {
        Tensor ag = a.narrow(row, rows), cg = c.narrow(row, rows);
        Tensor bg = b.slice_flat(g * b_rows * b.cols(), {b_rows, b.cols()});
        const int64_t n = args.trans_b ? b_rows : b.cols();
        if (args.bias) {
          Tensor bias = args.bias->slice_flat(g * c.cols(), {c.cols()});
          cuda::gemm(ag, bg, cg, {.trans_b = args.trans_b, .alpha = args.alpha, .beta = args.beta, .bias = &bias}, stream);
        } else {
          planned_gemm(ag, bg, cg, rows, n, a.cols(), false, args.trans_b, args.alpha, args.beta, stream);
        }
      }
    } else {
      // C_g [m, n] = A_g^T [m, rows] B_g [rows, n]: an empty group leaves beta * C_g.
      const int64_t c_rows = c.rows() / groups;
      Tensor cg = c.slice_flat(g * c_rows * c.cols(), {c_rows, c.cols()});
      if (rows > 0) {
        planned_gemm(a.narrow(row, rows), b.narrow(row, rows), cg, c_rows, c.cols(), rows, true, false,
                     args.alpha, args.beta, stream);
      } else if (args.beta == 0.0f) {
        fill(cg, 0.0f, stream);
      } else if (args.beta != 1.0f) {
        scale_inplace(cg, args.beta, stream);
      }
    }
    row += rows;
  }
}

}  // namespace megadlm::ops::cuda
