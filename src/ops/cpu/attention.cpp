// CPU reference of the attention family: direct loops over (batch, query head, query row), the
// executable specification of include/megadlm/ops/attention.h. Clarity over speed; the fast path
// is src/ops/cuda/attention*.cu. The backward formulas are derived in docs/kernels/attention.md.
// Templated on the element type: f32 (the CPU backend) and f64 (gradient checks). Attention
// dropout draws each element's keep bit from ops/attention_dropout_mask.h, the mapping shared with
// the CUDA kernels; dropout_p == 0 draws nothing and multiplies by nothing.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>
#include "ops/attention_dropout_mask.h"
#include "ops/cpu/cpu_ops.h"

namespace megadlm::ops::cpu {
namespace {

// Index arithmetic for q/out/dq [B, S, Hq, D], k/v/dk/dv [B, Skv, Hkv, D] and lse [B, Hq, S].
struct Layout {
  int64_t batch, seq, kv_seq, heads, kv_heads, dim, group;
  bool causal;

  explicit Layout(const AttentionArgs& a)
      : batch(a.batch), seq(a.seq), kv_seq(a.keys()), heads(a.num_heads), kv_heads(a.num_kv_heads),
        dim(a.head_dim), group(a.num_heads / a.num_kv_heads), causal(a.mask == AttentionMask::Causal) {}
  int64_t q_at(int64_t b, int64_t s, int64_t h) const { return ((b * seq + s) * heads + h) * dim; }
  int64_t kv_at(int64_t b, int64_t s, int64_t kh) const {
    return ((b * kv_seq + s) * kv_heads + kh) * dim;
  }
  int64_t lse_at(int64_t b, int64_t h, int64_t s) const { return (b * heads + h) * seq + s; }
};

// The keys query i of one row may see. When the keys are the queries' own rows (no key
// documents, one chunk map for both, kv_seq == seq) they are one range [first, last):
// documents are contiguous runs of equal ids, so a query sees the run holding it (cut at i + 1
// when causal; the maps are increasing, so local order is global order). Otherwise (another
// context-parallel shard) the range is every key and visible() decides each one: same document,
// and with the causal mask a global key position not after the query's.
struct KeyRange {
  std::vector<int64_t> first, last;  // [S]
  bool per_key = false;              // test every key with visible()
  const int32_t* query_docs = nullptr;
  const int32_t* key_docs = nullptr;
  bool causal = false;
  ChunkMap query_chunks, key_chunks;
  int64_t keys = 0;
  const int32_t* block_ranges = nullptr;  // block diffusion: this row's [4, L] ranges
  int64_t bd_half = 0;                    // L
  bool causal_clean = false;
  int64_t bd_strip = 0;                   // block_diffusion_strip: N, else 0

  /// Block diffusion: local row i of `rows` (both halves, each chunk-mapped by m) -> its row of
  /// the whole doubled row [x_t | x_0] of 2L rows.
  int64_t doubled_row(int64_t i, int64_t rows, const ChunkMap& m) const {
    const int64_t h = rows / 2;
    return (i < h ? 0 : bd_half) + m.global(i < h ? i : i - h);
  }

  KeyRange(const AttentionArgs& a, int64_t b, bool causal_mask)
      : first(a.seq, 0), last(a.seq, a.keys()), causal(causal_mask), query_chunks(a.query_chunks),
        key_chunks(a.key_chunks), keys(a.keys()) {
    per_key = a.key_document_ids != nullptr || a.keys() != a.seq ||
              (causal && !a.query_chunks.same_as(a.key_chunks));
    if (is_block_diffusion(a.mask)) {  // every key tested by the rule (no documents)
      bd_half = a.block_ranges->shape()[2];
      block_ranges = a.block_ranges->data<int32_t>() + b * 4 * bd_half;
      causal_clean = a.mask == AttentionMask::BlockDiffusionCausal;
      bd_strip = a.block_diffusion_strip ? a.block_diffusion_max_block : 0;
      per_key = true;
      return;
    }
    if (a.document_ids != nullptr) query_docs = a.document_ids->data<int32_t>() + b * a.seq;
    if (per_key) {
      if (a.document_ids != nullptr) {
        key_docs = a.key_document_ids != nullptr ? a.key_document_ids->data<int32_t>() + b * a.keys()
                                                 : query_docs;
      }
      return;
    }
    if (query_docs != nullptr) {
      const int32_t* d = query_docs;
      for (int64_t i = 1; i < a.seq; ++i) first[i] = d[i] == d[i - 1] ? first[i - 1] : i;
      for (int64_t i = a.seq - 1; i-- > 0;) last[i] = d[i] == d[i + 1] ? last[i + 1] : i + 1;
    }
    if (causal)
      for (int64_t i = 0; i < a.seq; ++i) last[i] = std::min(last[i], i + 1);
  }

  bool visible(int64_t i, int64_t j) const {
    if (!per_key) return true;
    if (block_ranges != nullptr)
      return block_diffusion_visible(block_ranges, bd_half, causal_clean,
                                     doubled_row(i, static_cast<int64_t>(first.size()), query_chunks),
                                     doubled_row(j, keys, key_chunks), bd_strip);
    if (query_docs != nullptr && query_docs[i] != key_docs[j]) return false;
    return !causal || key_chunks.global(j) <= query_chunks.global(i);
  }
};

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

void check_same_dtype(const char* op, DType t, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* x : tensors) {
    MDLM_CHECK(x->dtype() == t, op, ": CPU attention expects every activation in ", dtype_name(t),
               ", got ", x->str());
  }
}

// lse may be f32 (the public contract) or the activation dtype (f64 gradient checks keep the
// statistic exact so finite differences are not limited by its rounding).
void check_lse_dtype(const char* op, const Tensor& lse, DType t) {
  MDLM_CHECK(lse.dtype() == DType::F32 || lse.dtype() == t, op, ": lse must be f32 or ",
             dtype_name(t), ", got ", lse.str());
}

/// 1 / (1 - p): the fp32 factor the CUDA kernels use for f32, exact in double for f64 (as in
/// cpu/dropout.cpp).
template <typename T>
T keep_scale(const detail::AttentionDropoutMask& mask) {
  if constexpr (std::is_same_v<T, float>) return mask.scale;
  else return 1.0 / (1.0 - static_cast<double>(mask.p));
}

double read_lse(const Tensor& lse, int64_t i) {
  return lse.dtype() == DType::F64 ? lse.data<double>()[i] : lse.data<float>()[i];
}

void write_lse(Tensor& lse, int64_t i, double value) {
  if (lse.dtype() == DType::F64) lse.data<double>()[i] = value;
  else lse.data<float>()[i] = static_cast<float>(value);
}

template <typename T>
void forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                  const AttentionArgs& args) {
  const Layout L(args);
  const T* Q = q.data<T>();
  const T* K = k.data<T>();
  const T* V = v.data<T>();
  T* O = out.data<T>();
  const T scale = static_cast<T>(args.softmax_scale);
  const bool dropout = args.dropout_p > 0.0f;
  const auto mask = detail::AttentionDropoutMask::from_args(args);
  const T keep = keep_scale<T>(mask);
  std::vector<T> p(static_cast<size_t>(L.kv_seq));
  for (int64_t b = 0; b < L.batch; ++b) {
    const KeyRange keys(args, b, L.causal);
    for (int64_t h = 0; h < L.heads; ++h) {
      const int64_t kh = h / L.group;
      for (int64_t i = 0; i < L.seq; ++i) {
        const T* qi = Q + L.q_at(b, i, h);
        const int64_t j0 = keys.first[i], n = keys.last[i];
        // Max-subtracted softmax: exp never overflows, the largest term is exactly 1.
        T row_max = -std::numeric_limits<T>::infinity();
        for (int64_t j = j0; j < n; ++j) {
          if (!keys.visible(i, j)) continue;
          p[j] = scale * dot(qi, K + L.kv_at(b, j, kh), L.dim);
          row_max = std::max(row_max, p[j]);
        }
        T* oi = O + L.q_at(b, i, h);
        for (int64_t d = 0; d < L.dim; ++d) oi[d] = 0;
        if (row_max == -std::numeric_limits<T>::infinity()) {  // sees no key of this block
          write_lse(lse, L.lse_at(b, h, i), -std::numeric_limits<double>::infinity());
          continue;
        }
        T sum = 0;
        for (int64_t j = j0; j < n; ++j) {
          if (!keys.visible(i, j)) continue;
          p[j] = std::exp(p[j] - row_max);
          sum += p[j];
        }
        for (int64_t j = j0; j < n; ++j) {
          if (!keys.visible(i, j)) continue;
          T w = p[j] / sum;
          // The normaliser (and lse) stay those of the undropped row.
          if (dropout) w = mask.keep(b, h, i, j) ? w * keep : T(0);
          const T* vj = V + L.kv_at(b, j, kh);
          for (int64_t d = 0; d < L.dim; ++d) oi[d] += w * vj[d];
        }
        write_lse(lse, L.lse_at(b, h, i), static_cast<double>(row_max + std::log(sum)));
      }
    }
  }
}

// With s_ij = scale * q_i.k_j, P = exp(s - lse), O = P V and a scalar loss with dO = dL/dO:
//   dV = P^T dO,  dP = dO V^T,  D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij,
//   dS = P * (dP - D)  (softmax backward),  dQ = scale * dS K,  dK = scale * dS^T Q,
// with dK, dV of a KV head summed over the query heads of its group. With dropout (keep mask Z,
// factor c = 1/(1-p)), O = (P * Z c) V, so dV = (P * Z c)^T dO and dP = (dO V^T) * Z c; D_i is
// still sum_j P_ij dP_ij = dO_i . O_i, and dS, dQ, dK keep their form.
template <typename T>
void backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                   const AttentionArgs& args) {
  const Layout L(args);
  const T* dO = dout.data<T>();
  const T* Q = q.data<T>();
  const T* K = k.data<T>();
  const T* V = v.data<T>();
  const T* O = out.data<T>();
  T* dQ = dq.data<T>();
  T* dK = dk.data<T>();
  T* dV = dv.data<T>();
  const T scale = static_cast<T>(args.softmax_scale);
  const bool dropout = args.dropout_p > 0.0f;
  const auto mask = detail::AttentionDropoutMask::from_args(args);
  const T keep = keep_scale<T>(mask);
  for (int64_t i = 0; i < dk.numel(); ++i) dK[i] = 0;
  for (int64_t i = 0; i < dv.numel(); ++i) dV[i] = 0;
  for (int64_t b = 0; b < L.batch; ++b) {
    const KeyRange keys(args, b, L.causal);
    for (int64_t h = 0; h < L.heads; ++h) {
      const int64_t kh = h / L.group;
      for (int64_t i = 0; i < L.seq; ++i) {
        const T* qi = Q + L.q_at(b, i, h);
        const T* doi = dO + L.q_at(b, i, h);
        const T lse_i = static_cast<T>(read_lse(lse, L.lse_at(b, h, i)));
        const T delta_i = dot(doi, O + L.q_at(b, i, h), L.dim);
        T* dqi = dQ + L.q_at(b, i, h);
        for (int64_t d = 0; d < L.dim; ++d) dqi[d] = 0;
        for (int64_t j = keys.first[i]; j < keys.last[i]; ++j) {
          if (!keys.visible(i, j)) continue;
          const T* kj = K + L.kv_at(b, j, kh);
          const T* vj = V + L.kv_at(b, j, kh);
          const T p = std::exp(scale * dot(qi, kj, L.dim) - lse_i);
          T dp = dot(doi, vj, L.dim);
          T pz = p;  // the probability O used: P * Z / (1-p)
          if (dropout) {
            const T z = mask.keep(b, h, i, j) ? keep : T(0);
            dp *= z;
            pz *= z;
          }
          const T ds = p * (dp - delta_i);
          T* dkj = dK + L.kv_at(b, j, kh);
          T* dvj = dV + L.kv_at(b, j, kh);
          for (int64_t d = 0; d < L.dim; ++d) {
            dvj[d] += pz * doi[d];
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
        for (int64_t d = 0; d < L.dim; ++d) dqi[d] *= scale;
      }
    }
  }
  for (int64_t i = 0; i < dk.numel(); ++i) dK[i] *= scale;
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream) {
  check_same_dtype("attention_forward", q.dtype(), {&k, &v, &out});
  check_lse_dtype("attention_forward", lse, q.dtype());
  if (q.dtype() == DType::F64) forward_impl<double>(q, k, v, out, lse, args);
  else forward_impl<float>(q, k, v, out, lse, args);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream) {
  check_same_dtype("attention_backward", q.dtype(), {&dout, &k, &v, &out, &dq, &dk, &dv});
  check_lse_dtype("attention_backward", lse, q.dtype());
  if (q.dtype() == DType::F64) backward_impl<double>(dout, q, k, v, out, lse, dq, dk, dv, args);
  else backward_impl<float>(dout, q, k, v, out, lse, dq, dk, dv, args);
}

}  // namespace megadlm::ops::cpu
