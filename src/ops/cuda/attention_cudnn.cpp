// cuDNN backend of the attention family (contract in attention_cudnn.h): cuDNN's fused flash
// attention as SDPA graphs built on the generic backend-graph layer of cudnn_graph.h (the C++
// frontend is not available here).
//
// The graphs are the composite SDPA graphs the frontend emits (cuDNN's SDPA forward and backward),
// node for node, because cuDNN's heuristics only offer its fused engine for graphs matching that
// pattern. Logical dims are always [b, h, s, d]; megadlm's [B, S, H, D] tensors enter through
// their strides ({S H D, D, H D, 1}); K enters the first product as K^T (axes 2 and 3 swapped).
// Stats, cuDNN's softmax statistic, is max + log(sum exp(x - max)) of the scaled, masked scores:
// natural log, [b, h, s, 1] with strides {h s, s, 1, 1}, i.e. exactly our lse [B, Hq, S], so
// calls hand our lse buffer to cuDNN as is.
//
// Packed documents (document_ids) run as one ragged batch: batch = documents (rounded up to a
// power of two so that few plans exist; the extra documents are empty), logical s = S, every
// tensor with a ragged offset (element offset of each document) and the padding mask
// (per-document lengths). The statistics stay in our lse [B, Hq, S]: the dense strides plus a
// per-document offset (documents never cross rows), so no kernel converts them.
//
// Determinism: the default backward accumulates dQ in an fp32 buffer (not reproducible); the
// deterministic graph writes dQ from one product (the frontend's "dP workspace" variant) and
// only engines without CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC are accepted.
//
// cuDNN version: built against the toolkit's headers, run against whatever libcudnn.so.9 loads
// (9.14 on the benchmark machine): only attributes present in 9.14 are used and features are
// gated on the runtime version (ops/attention_support.cpp). Plans are cached per shape key for
// the process (cudnn::PlanCache, under its mutex); a key whose build failed is remembered as
// refused so that it costs one failed build.
#include "ops/cuda/attention_cudnn.h"
#include "ops/attention_support.h"

#if MEGADLM_WITH_CUDNN
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>
#include "core/cuda/cuda_utils.h"
#include "ops/cuda/attention_cudnn_prep.h"
#include "ops/cuda/cudnn_graph.h"
#include "ops/cuda/internal.h"

namespace megadlm::ops::cuda {
namespace {

using cudnn::Dims;
using cudnn::Graph;
using cudnn::Refused;
using cudnn::TensorRef;
using cudnn::VariantPack;

// Unique ids of the non-virtual tensors (the variant pack's keys; below cudnn::kFirstVirtualUid).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kSeqQ, kSeqKv, kDout, kDq, kDk, kDv,
  kSoftmaxSum, kDqAccum, kDkFull, kDvFull, kOffQ, kOffK, kOffV, kOffO, kOffStats,
};
static_assert(kOffStats < cudnn::kFirstVirtualUid);

// ---- plan keys and the cache ----------------------------------------------------------------

struct Key {
  int device;
  bool backward;
  int64_t b, h, hk, s, d;  ///< b: batch rows, or (ragged) the document bucket
  int64_t row_q, row_kv;   ///< elements from one token to the next in q (dq) and k, v (dk, dv)
  bool causal, ragged, deterministic;
  bool row_padding;  ///< forward with AttentionArgs::row_lengths: dense rows, padding mask
  /// Elements from one batch row to the next in q, k/v, out (and dout), dq, dk/dv, and from one
  /// head's statistics to the next: s times the token stride (s) for whole tensors; more for the
  /// row windows of larger tensors (cudnn_attention_*_rows).
  int64_t q_batch, kv_batch, o_batch, dq_batch, dkv_batch, stat_s;
  auto tie() const {
    return std::tie(device, backward, b, h, hk, s, d, row_q, row_kv, causal, ragged, deterministic,
                    row_padding, q_batch, kv_batch, o_batch, dq_batch, dkv_batch, stat_s);
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
};

cudnn::PlanCache<Key, Plan>& cache() {
  static auto* c = new cudnn::PlanCache<Key, Plan>();  // never destroyed: plans live for the process
  return *c;
}

// ---- the graphs -----------------------------------------------------------------------------

/// Logical [b, h, s, d] dims and the strides of megadlm's token-major tensors: q (and dq) and
/// k, v (and dk, dv) with token strides row_q and row_kv (h d and hk d for separate tensors, the
/// packed row (h + 2 hk) d for the fused QKV buffer); out and dout with token stride h d. Batch
/// strides from the key (s times the token stride, or a row window's larger one); the
/// statistics [b, h, s, 1] with the key's per-head stride (s, or the whole row's length).
struct Shapes {
  int64_t b, h, hk, s, d, row_q, row_kv, q_batch, kv_batch, o_batch, dq_batch, dkv_batch, stat_s;
  explicit Shapes(const Key& k)
      : b(k.b), h(k.h), hk(k.hk), s(k.s), d(k.d), row_q(k.row_q), row_kv(k.row_kv), q_batch(k.q_batch),
        kv_batch(k.kv_batch), o_batch(k.o_batch), dq_batch(k.dq_batch), dkv_batch(k.dkv_batch),
        stat_s(k.stat_s) {}
  Dims q_dims() const { return {b, h, s, d}; }
  Dims q_strides() const { return {q_batch, d, row_q, 1}; }
  Dims dq_strides() const { return {dq_batch, d, row_q, 1}; }
  Dims o_strides() const { return {o_batch, d, h * d, 1}; }
  Dims kv_dims() const { return {b, hk, s, d}; }
  Dims kv_strides() const { return {kv_batch, d, row_kv, 1}; }
  Dims dkv_strides() const { return {dkv_batch, d, row_kv, 1}; }
  Dims kt_dims() const { return {b, hk, d, s}; }
  Dims kt_strides() const { return {kv_batch, d, 1, row_kv}; }
  Dims stat_dims() const { return {b, h, s, 1}; }
  /// Virtual and scratch statistics (contiguous).
  Dims stat_strides() const { return {h * s, s, 1, 1}; }
  /// The Stats tensor itself (our lse, or a row window of it).
  Dims stats_io_strides() const { return {h * stat_s, stat_s, 1, 1}; }
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

/// The forward: S = scale Q K^T (masked), Stats = max + log(sum exp), O = softmax(S) V.
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
  const TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, x.stat_dims(), x.stats_io_strides(), false, false,
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
  const TensorRef max = g.virt(CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, max);
  const TensorRef shifted = g.pointwise(CUDNN_POINTWISE_SUB, s, &max);
  const TensorRef e = g.pointwise(CUDNN_POINTWISE_EXP, shifted);
  const TensorRef sum = g.virt(CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const TensorRef log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum);
  g.pointwise_into(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, &log_sum, nullptr, stats);
  // P takes the I/O type: cuDNN wants the second product's A operand in bf16.
  const TensorRef p = g.virt_like(CUDNN_DATA_BFLOAT16, s);
  g.pointwise_into(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, &sum, nullptr, p);
  g.matmul(p, v, o, plan->padding ? &seq_q : nullptr, nullptr, plan->padding ? &seq_kv : nullptr);
  g.build_plan(false, cudnn::autotune_candidates(false));
  return plan;
}

/// The backward: Delta = rowsum(dO O); P = exp(scale Q K^T - Stats); dV = P^T dO;
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
  // adds a padding mask with full lengths).
  plan->padding = ragged || (key.s % 128 != 0 && cudnn::runtime_version() <= 91500);
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
  const TensorRef dq = io(kDq, x.q_dims(), x.dq_strides(), &off.q);
  const TensorRef dk = io(kDk, x.kv_dims(), x.dkv_strides(), &off.k);
  const TensorRef dv = io(kDv, x.kv_dims(), x.dkv_strides(), &off.v);
  const TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, x.stat_dims(), x.stats_io_strides(), false, false,
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
  const TensorRef rowsum = g.virt(CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  const TensorRef softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, x.stat_dims(), x.stat_strides(),
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
  g.build_plan(key.deterministic, cudnn::autotune_candidates(key.deterministic));
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
      {key.row_q, key.row_kv, a.num_heads * a.head_dim, a.num_heads, a.seq},
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

/// Batch strides (elements) of a call's tensors and the statistics' per-head stride where they
/// are not the whole tensors' (0: s times the token stride, and s): the row windows.
struct Strides {
  int64_t q = 0, kv = 0, o = 0, dq = 0, dkv = 0, stat = 0;
};

Key key_of(const AttentionArgs& a, bool backward, int device, int64_t bucket, const QkvPointers& p,
           const Strides& st) {
  const bool padded = attention_row_padded(a, backward), ragged = attention_ragged_documents(a, backward);
  const int64_t s = a.seq;
  auto or_else = [](int64_t v, int64_t dflt) { return v > 0 ? v : dflt; };
  return {device, backward, ragged ? bucket : a.batch, a.num_heads, a.num_kv_heads, s, a.head_dim,
          p.row_q, p.row_kv, a.mask == AttentionMask::Causal, ragged, backward && a.deterministic, padded,
          or_else(st.q, s * p.row_q), or_else(st.kv, s * p.row_kv), or_else(st.o, s * a.num_heads * a.head_dim),
          or_else(st.dq, s * p.row_q), or_else(st.dkv, s * p.row_kv), or_else(st.stat, s)};
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

Scratch make_scratch(const Plan& plan, int64_t tokens, const Stream& stream) {
  auto round = [](int64_t n) { return (n + 255) / 256 * 256; };
  const int64_t total = round(plan.graph->workspace_bytes()) +
                        round(plan.softmax_sum_per_token * tokens) +
                        round(plan.dq_accum_per_token * tokens) +
                        round(plan.dk_full_per_token * tokens) +
                        round(plan.dv_full_per_token * tokens);
  Scratch s;
  if (total > 0) {
    s.buffer = Tensor::empty({(total + 7) / 8}, DType::I64, stream);
    s.base = static_cast<char*>(s.buffer.data_ptr());
  }
  return s;
}

/// Queues the plan (autotuned first when enabled); a failure (nothing queued) is returned as
/// the reason and refuses the key. Under the cache's mutex.
std::string execute(const Key& key, Plan& plan, const VariantPack& pack, void* workspace,
                    const Stream& stream) try {
  cudnn::autotune(*plan.graph, pack, workspace, stream,
                  megadlm::detail::concat(key.backward ? "backward" : "forward", " b ", key.b, " h ",
                                          key.h, "/", key.hk, " s ", key.s, " d ", key.d,
                                          key.causal ? " causal" : "", key.ragged ? " ragged" : ""));
  cudnn::execute(*plan.graph, pack, workspace, stream);
  return {};
} catch (const Refused& e) {
  cache().refuse(key, e.what());
  return e.what();
}

bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

/// One call's setup, the same in both directions: the support check, alignment, the documents,
/// the plan (under the cache's lock, held until the launch), the scratch, and the variant pack's
/// common entries (q, k, v, o, the statistics in lse, the scalars, the ragged offsets and
/// lengths or the padding lengths). Lives on the caller's stack: the pack points at its scalars.
struct Call {
  std::optional<NvtxRange> range;
  Documents docs;
  std::unique_lock<std::mutex> lock;
  Key key{};
  std::shared_ptr<Plan> plan;
  Scratch scratch;
  void* workspace = nullptr;
  VariantPack pack;
  float scale = 0.0f, neg_inf = -INFINITY, one = 1.0f;
};

/// Fills `call`; false with the reason in *refusal when cuDNN does not run the call (nothing is
/// queued then).
bool prologue(const char* range, const AttentionArgs& a, bool backward, const QkvPointers& in,
              void* out, void* stats, const Strides& strides, std::initializer_list<const void*> tensors,
              const Stream& stream, Call& call, std::string* refusal) {
  *refusal = cudnn_attention_unsupported(a, backward);
  if (!refusal->empty()) return false;
  if (!aligned16(tensors)) {
    *refusal = "a tensor is not 16-byte aligned";
    return false;
  }
  call.range.emplace(range);
  const bool ragged = attention_ragged_documents(a, backward);
  if (ragged) {
    call.docs.count = document_count(a, stream, &call.docs.starts_host_derived);
    call.docs.bucket = bucket_for(call.docs.count);
  }
  auto& c = cache();
  call.lock = std::unique_lock<std::mutex>(c.mutex());
  call.key = key_of(a, backward, stream.cuda_resources()->device, call.docs.bucket, in, strides);
  const Key& key = call.key;
  call.plan = c.get(
      key,
      [&] {
        const cudnnHandle_t h = cudnn::handle_for(key.device);
        return key.backward ? build_backward(h, key) : build_forward(h, key);
      },
      refusal);
  if (!call.plan) return false;
  const Plan& plan = *call.plan;
  call.scratch = make_scratch(plan, a.batch * a.seq, stream);
  call.workspace = call.scratch.take(plan.graph->workspace_bytes());
  call.scale = a.softmax_scale;
  call.pack = {{kQ, in.q}, {kK, in.k}, {kV, in.v}, {kO, out}, {kStats, stats}, {kScale, &call.scale}};
  if (plan.padding || key.causal) call.pack.emplace_back(kNegInf, &call.neg_inf);
  if (ragged) {
    Documents& docs = call.docs;
    prepare_documents(a, key, docs, stream);
    call.pack.insert(call.pack.end(),
                     {{kSeqQ, docs.seq_len.data_ptr()}, {kSeqKv, docs.seq_len.data_ptr()},
                      {kOffQ, docs.q_off()}, {kOffO, docs.o_off()}, {kOffK, docs.kv_off()},
                      {kOffV, docs.kv_off()}, {kOffStats, docs.stats_off()}});
  } else if (plan.padding) {
    // The row lengths of a padded forward, or the full lengths of the backward's workaround.
    void* lengths = key.row_padding ? a.row_lengths->data_ptr() : plan.constant_seq_len;
    call.pack.insert(call.pack.end(), {{kSeqQ, lengths}, {kSeqKv, lengths}});
  }
  return true;
}

CudnnRun run_forward(const QkvPointers& in, void* out, void* stats, const AttentionArgs& a,
                     const Stream& stream, const Strides& strides = {}) {
  CudnnRun run;
  Call call;
  if (!prologue("attention_forward_cudnn", a, false, in, out, stats, strides, {in.q, in.k, in.v, out}, stream,
                call, &run.refusal))
    return run;
  run.refusal = execute(call.key, *call.plan, call.pack, call.workspace, stream);
  run.ran = run.refusal.empty();
  return run;
}

CudnnRun run_backward(void* dout, const QkvPointers& in, void* out, void* stats, const QkvPointers& grad,
                      const AttentionArgs& a, const Stream& stream, const Strides& strides = {}) {
  CudnnRun run;
  Call call;
  if (!prologue("attention_backward_cudnn", a, true, in, out, stats, strides,
                {dout, in.q, in.k, in.v, out, grad.q, grad.k, grad.v}, stream, call, &run.refusal))
    return run;
  const Plan& plan = *call.plan;
  const int64_t tokens = a.batch * a.seq;
  call.pack.insert(call.pack.end(), {{kDout, dout}, {kDq, grad.q}, {kDk, grad.k},
                                     {kDv, grad.v}, {kOne, &call.one},
                                     {kSoftmaxSum, call.scratch.take(plan.softmax_sum_per_token * tokens)}});
  if (void* p = call.scratch.take(plan.dq_accum_per_token * tokens)) call.pack.emplace_back(kDqAccum, p);
  if (void* p = call.scratch.take(plan.dk_full_per_token * tokens)) call.pack.emplace_back(kDkFull, p);
  if (void* p = call.scratch.take(plan.dv_full_per_token * tokens)) call.pack.emplace_back(kDvFull, p);
  run.refusal = execute(call.key, *call.plan, call.pack, call.workspace, stream);
  run.ran = run.refusal.empty();
  return run;
}

}  // namespace

int64_t cudnn_runtime_version() { return cudnn::runtime_version(); }

std::string cudnn_attention_version() {
  const int64_t v = cudnn::runtime_version();
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

std::string cudnn_attention_unsupported(const AttentionArgs& a, bool backward) {
  return attention_cudnn_refusal(a, backward, cudnn_runtime_version());
}

CudnnRun cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                 Tensor& lse, const AttentionArgs& a, const Stream& stream) {
  return run_forward(separate(q, k, v, a), out.data_ptr(), lse.data_ptr(), a, stream);
}

CudnnRun cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& a,
                                  const Stream& stream) {
  return run_backward(dout.data_ptr(), separate(q, k, v, a), out.data_ptr(), lse.data_ptr(),
                      separate(dq, dk, dv, a), a, stream);
}

namespace {

/// `elements` bf16 (or f32: 4-byte) elements past p.
void* at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.data_ptr()) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

/// The q, k, v (or dout / out) row windows of separate tensors holding w.rows rows a batch row.
QkvPointers window(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionArgs& a,
                   const CudnnRowWindow& w) {
  const QkvPointers p = separate(q, k, v, a);
  return {at(q, w.q_row0 * p.row_q), at(k, w.kv_row0 * p.row_kv), at(v, w.kv_row0 * p.row_kv), p.row_q,
          p.row_kv};
}

std::string window_refusal(const AttentionArgs& a, const CudnnRowWindow& w, const void* stats) {
  if (a.document_ids != nullptr || a.row_lengths != nullptr) return "a row window of packed documents";
  if (w.rows < a.seq || w.q_row0 < 0 || w.kv_row0 < 0 || w.q_row0 + a.seq > w.rows || w.kv_row0 + a.seq > w.rows)
    return "a row window outside its rows";
  if (stats != nullptr && reinterpret_cast<uintptr_t>(stats) % 16 != 0)
    return "the statistics' row window is not 16-byte aligned";
  return {};
}

}  // namespace

CudnnRun cudnn_attention_forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                      Tensor& lse, const AttentionArgs& a, const CudnnRowWindow& w,
                                      const Stream& stream) {
  if (std::string why = window_refusal(a, w, nullptr); !why.empty()) return {false, why};
  const QkvPointers in = window(q, k, v, a, w);
  Strides st;
  st.q = w.rows * in.row_q;
  st.kv = w.rows * in.row_kv;
  return run_forward(in, out.data_ptr(), lse.data_ptr(), a, stream, st);
}

CudnnRun cudnn_attention_backward_rows(const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       Tensor& dq, Tensor& dk, Tensor& dv, const AttentionArgs& a,
                                       const CudnnRowWindow& w, const Stream& stream) {
  void* stats = at(lse, w.lse_row0);
  if (std::string why = window_refusal(a, w, stats); !why.empty()) return {false, why};
  const QkvPointers in = window(q, k, v, a, w);
  const int64_t hd = a.num_heads * a.head_dim;
  Strides st;
  st.q = w.rows * in.row_q;
  st.kv = w.rows * in.row_kv;
  st.o = w.rows * hd;
  st.stat = w.lse_rows;
  return run_backward(at(dout, w.q_row0 * hd), in, at(out, w.q_row0 * hd), stats, separate(dq, dk, dv, a), a,
                      stream, st);
}

CudnnRun cudnn_attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out,
                                        Tensor& lse, const AttentionArgs& a, const Stream& stream) {
  if (std::string why = attention_cudnn_packed_refusal(a, false); !why.empty()) return {false, why};
  return run_forward(packed(qk_rows, v_rows, a), out.data_ptr(), lse.data_ptr(), a, stream);
}

CudnnRun cudnn_attention_backward_packed(const Tensor& dout, const Tensor& qk_rows,
                                         const Tensor& v_rows, const Tensor& out, const Tensor& lse,
                                         Tensor& dqkv, const AttentionArgs& a, const Stream& stream) {
  if (std::string why = attention_cudnn_packed_refusal(a, true); !why.empty()) return {false, why};
  return run_backward(dout.data_ptr(), packed(qk_rows, v_rows, a), out.data_ptr(), lse.data_ptr(),
                      packed(dqkv, dqkv, a), a, stream);
}

}  // namespace megadlm::ops::cuda

#else  // cuDNN not found at configure time: every call is refused with the reason.

namespace megadlm::ops::cuda {

int64_t cudnn_runtime_version() { return 0; }

std::string cudnn_attention_version() { return "cuDNN (not built: cudnn_graph.h not found)"; }

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

CudnnRun cudnn_attention_forward_rows(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                                      const AttentionArgs& a, const CudnnRowWindow&, const Stream&) {
  return {false, cudnn_attention_unsupported(a, false)};
}

CudnnRun cudnn_attention_backward_rows(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                                       const AttentionArgs& a, const CudnnRowWindow&, const Stream&) {
  return {false, cudnn_attention_unsupported(a, true)};
}

}  // namespace megadlm::ops::cuda

#endif
