// Dispatch for the attention family (see include/megadlm/ops/attention.h).
#include "megadlm/ops/attention.h"
#include "megadlm/ops/elementwise.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/dispatch.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace megadlm::ops {

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::Auto: return "auto";
    case AttentionBackend::Cudnn: return "cudnn";
    case AttentionBackend::Flash: return "flash";
  }
  return "?";
}

bool block_diffusion_visible(const int32_t* r, int64_t half, bool causal_clean, int64_t i,
                             int64_t j, int64_t strip) {
  const bool noisy_q = i < half, noisy_k = j < half;
  const int64_t p = noisy_q ? i : i - half, kp = noisy_k ? j : j - half;
  // The strip: without the clean keys the two causal bulks cover (shifted by N, by 1).
  if (strip > 0 && !noisy_k && kp <= p - (noisy_q ? strip : 1)) return false;
  const int32_t doc_start = r[p], block_start = r[2 * half + p], block_end = r[3 * half + p];
  if (noisy_q) return noisy_k ? block_start <= kp && kp < block_end : doc_start <= kp && kp < block_start;
  if (noisy_k) return false;
  return doc_start <= kp && (causal_clean ? kp <= p : kp < block_end);
}

namespace {
void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionArgs& a) {
  MDLM_CHECK(a.batch > 0 && a.seq > 0 && a.num_heads > 0 && a.num_kv_heads > 0 && a.head_dim > 0,
             op, ": batch, seq, heads and head_dim must be positive");
  MDLM_CHECK(a.num_heads % a.num_kv_heads == 0, op, ": num_heads ", a.num_heads,
             " is not a multiple of num_kv_heads ", a.num_kv_heads);
  MDLM_CHECK(a.softmax_scale > 0, op, ": softmax_scale must be positive");
  MDLM_CHECK(a.dropout_p >= 0.0f && a.dropout_p < 1.0f, op, ": dropout_p ", a.dropout_p,
             " must be in [0, 1) (--attention-dropout)");
  if (a.dropout_p > 0) {
    // The counter packs (site << 16) | global head into one 32-bit word.
    MDLM_CHECK(a.sample_offset >= 0 && a.head_offset >= 0 && a.query_offset >= 0 &&
                   a.key_offset >= 0,
               op, ": dropout offsets must be non-negative");
    MDLM_CHECK(a.head_offset + a.num_heads <= 65536 && a.dropout_site <= 65535, op,
               ": attention dropout needs global heads and dropout_site below 65536, got heads up "
               "to ", a.head_offset + a.num_heads - 1, " and site ", a.dropout_site);
  }
  detail::check_float_activation(op, q, "q");
  detail::check_numel(op, q, a.batch * a.seq * a.num_heads * a.head_dim, "q");
  MDLM_CHECK(a.kv_seq >= 0, op, ": kv_seq must be >= 0 (0: seq), got ", a.kv_seq);
  detail::check_numel(op, k, a.batch * a.keys() * a.num_kv_heads * a.head_dim, "k");
  detail::check_numel(op, v, a.batch * a.keys() * a.num_kv_heads * a.head_dim, "v");
  for (const ChunkMap* m : {&a.query_chunks, &a.key_chunks}) {
    MDLM_CHECK(m->len >= 0 && m->first >= 0 && m->second >= 0, op,
               ": chunk maps must be non-negative");
  }
  // Block diffusion maps each half of the doubled rows (ops/attention.h, block_ranges).
  const int64_t map_rows = is_block_diffusion(a.mask) ? 2 : 1;
  MDLM_CHECK(a.query_chunks.identity() || 2 * map_rows * a.query_chunks.len == a.seq, op,
             ": a chunked query map holds two chunks of ", a.query_chunks.len, " rows, not seq ",
             a.seq, map_rows == 2 ? " / 2 (block diffusion: one map per half)" : "");
  MDLM_CHECK(a.key_chunks.identity() || 2 * map_rows * a.key_chunks.len == a.keys(), op,
             ": a chunked key map holds two chunks of ", a.key_chunks.len, " rows, not kv_seq ",
             a.keys(), map_rows == 2 ? " / 2 (block diffusion: one map per half)" : "");
  MDLM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), op, ": q, k, v dtypes differ");
  if (a.document_ids != nullptr) {
    MDLM_CHECK(a.document_ids->dtype() == DType::I32 && a.document_ids->numel() == a.batch * a.seq &&
                   a.document_ids->device() == q.device(),
               op, ": document_ids must be int32 [batch, seq] on the device of q, got ",
               a.document_ids->str());
  }
  if (a.key_document_ids != nullptr) {
    MDLM_CHECK(a.document_ids != nullptr, op, ": key_document_ids needs document_ids");
    MDLM_CHECK(a.key_document_ids->dtype() == DType::I32 &&
                   a.key_document_ids->numel() == a.batch * a.keys() &&
                   a.key_document_ids->device() == q.device(),
               op, ": key_document_ids must be int32 [batch, kv_seq] on the device of q, got ",
               a.key_document_ids->str());
  }
  if (a.document_starts != nullptr) {
    const Tensor& s = *a.document_starts;
    MDLM_CHECK(a.document_ids != nullptr, op, ": document_starts needs document_ids");
    MDLM_CHECK(s.dtype() == DType::I32 && s.numel() >= 2 && s.numel() <= a.batch * a.seq + 1 &&
                   s.device() == q.device(),
               op, ": document_starts must be int32 [documents + 1] (2 .. batch * seq + 1 entries) "
               "on the device of q, got ", s.str());
  }
  if (a.row_lengths != nullptr) {
    const Tensor& r = *a.row_lengths;
    MDLM_CHECK(a.document_ids != nullptr, op, ": row_lengths needs document_ids");
    MDLM_CHECK(r.dtype() == DType::I32 && r.numel() == a.batch && r.device() == q.device(), op,
               ": row_lengths must be int32 [batch] on the device of q, got ", r.str());
  }
  if (is_block_diffusion(a.mask)) {
    MDLM_CHECK(a.block_ranges != nullptr, op, ": a block diffusion mask needs block_ranges");
    const Tensor& r = *a.block_ranges;
    const int64_t half = r.dim() == 3 ? r.shape()[2] : 0;  // L of the whole doubled rows
    MDLM_CHECK(a.seq % 2 == 0 && a.keys() % 2 == 0 && r.dtype() == DType::I32 && half > 0 &&
                   r.numel() == a.batch * 4 * half && r.device() == q.device(),
               op, ": block_ranges must be int32 [batch, 4, L] on the device of q (seq ", a.seq,
               " and kv_seq ", a.keys(), " even), got ", r.str());
    // A shard's half is chunk-mapped into [0, L); without a map it is the whole half.
    MDLM_CHECK((a.query_chunks.identity() ? a.seq / 2 == half : a.seq / 2 <= half) &&
                   (a.key_chunks.identity() ? a.keys() / 2 == half : a.keys() / 2 <= half),
               op, ": block diffusion rows of ", a.seq / 2, " query and ", a.keys() / 2,
               " key positions per half do not match block_ranges of L = ", half,
               " positions (an unmapped half holds all L)");
    MDLM_CHECK(a.document_ids == nullptr && a.row_lengths == nullptr && a.dropout_p == 0.0f,
               op, ": a block diffusion mask takes its documents from block_ranges and runs without "
               "document_ids, row_lengths and attention dropout");
    MDLM_CHECK(a.block_diffusion_max_block >= 0, op, ": block_diffusion_max_block must be >= 0, got ",
               a.block_diffusion_max_block);
    MDLM_CHECK(!a.block_diffusion_strip || (a.block_diffusion_max_block > 0 && a.query_chunks.identity() &&
                                            a.key_chunks.identity() && a.kv_seq == 0),
               op, ": block_diffusion_strip needs block_diffusion_max_block > 0 and whole rows "
               "(no chunk maps, no kv_seq)");
  } else {
    MDLM_CHECK(a.block_ranges == nullptr && a.block_diffusion_max_block == 0 && !a.block_diffusion_strip,
               op, ": block_ranges, block_diffusion_max_block and block_diffusion_strip need a block "
               "diffusion mask");
  }
  if (q.is_cuda()) {
    MDLM_CHECK(q.dtype() == DType::BF16, op, ": CUDA attention takes bf16, got ", q.str());
    // 64 and 128 run the flash kernels; other sizes up to 256 the simple CUDA path.
    MDLM_CHECK(a.head_dim <= 256, op, ": CUDA attention supports head_dim <= 256 (flash kernels "
               "for 64 and 128), got ", a.head_dim, " (--kv-channels)");
  }
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const AttentionArgs& args, const Stream& stream) {
  detail::check_device("attention_forward", stream, {&q, &k, &v, &out, &lse});
  check_attention("attention_forward", q, k, v, args);
  detail::check_numel("attention_forward", out, q.numel(), "out");
  detail::check_numel("attention_forward", lse, args.batch * args.num_heads * args.seq, "lse");
  detail::check_aux_float("attention_forward", lse, q, "lse");
  // CUDA: the support table (ops/attention_support.h) picks the implementation.
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(cuda::attention_forward(q, k, v, out, lse, args, stream));
  } else {
    cpu::attention_forward(q, k, v, out, lse, args, stream);
  }
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionArgs& args, const Stream& stream) {
  detail::check_device("attention_backward", stream, {&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv});
  check_attention("attention_backward", q, k, v, args);
  detail::check_numel("attention_backward", dout, q.numel(), "dout");
  detail::check_numel("attention_backward", out, q.numel(), "out");
  detail::check_numel("attention_backward", dq, q.numel(), "dq");
  detail::check_numel("attention_backward", dk, k.numel(), "dk");
  detail::check_numel("attention_backward", dv, v.numel(), "dv");
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(cuda::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, args, stream));
  } else {
    cpu::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, args, stream);
  }
}

namespace {
/// q, k, v as separate tensors: column slices of the packed rows (the CPU path and the own
/// CUDA kernels run on these copies).
struct SplitQkv {
  Tensor q, k, v;
};

SplitQkv split_qkv(const Tensor& qk_rows, const Tensor& v_rows, const AttentionArgs& a,
                   const Stream& stream) {
  const int64_t t = a.batch * a.seq, width = qk_rows.numel() / t;
  const int64_t hd = a.num_heads * a.head_dim, kd = a.num_kv_heads * a.head_dim;
  SplitQkv s{Tensor::empty({t, hd}, qk_rows.dtype(), stream), Tensor::empty({t, kd}, qk_rows.dtype(), stream),
             Tensor::empty({t, kd}, qk_rows.dtype(), stream)};
  if (qk_rows.data_ptr() == v_rows.data_ptr()) {
    split_columns(qk_rows.view({t, width}), {&s.q, &s.k, &s.v}, stream);
    return s;
  }
  // Two sources: each split also copies the columns it does not need (the fallback's cost).
  Tensor unused_v = Tensor::empty({t, kd}, qk_rows.dtype(), stream);
  split_columns(qk_rows.view({t, width}), {&s.q, &s.k, &unused_v}, stream);
  unused_v = Tensor();
  Tensor unused_qk = Tensor::empty({t, hd + kd}, qk_rows.dtype(), stream);
  split_columns(v_rows.view({t, width}), {&unused_qk, &s.v}, stream);
  return s;
}

void check_packed(const char* op, const Tensor& qkv, const AttentionArgs& a) {
  const int64_t width = (a.num_heads + 2 * a.num_kv_heads) * a.head_dim;
  detail::check_numel(op, qkv, a.batch * a.seq * width, "qkv");
}
}  // namespace

void attention_forward_packed(const Tensor& qkv, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream) {
  attention_forward_packed(qkv, qkv, out, lse, args, stream);
}

void attention_backward_packed(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, Tensor& dqkv, const AttentionArgs& args,
                               const Stream& stream) {
  attention_backward_packed(dout, qkv, qkv, out, lse, dqkv, args, stream);
}

void attention_forward_packed(const Tensor& qk_rows, const Tensor& v_rows, Tensor& out, Tensor& lse,
                              const AttentionArgs& args, const Stream& stream) {
  const char* op = "attention_forward_packed";
  detail::check_device(op, stream, {&qk_rows, &v_rows, &out, &lse});
  check_packed(op, qk_rows, args);
  check_packed(op, v_rows, args);
  // cuDNN reads the packed rows in place where the support table says so (never a
  // context-parallel block); otherwise split copies take the separate-tensor path.
  if (stream.is_cuda()) {
    bool done = false;
    MDLM_CUDA_BACKEND(done = cuda::attention_forward_packed(qk_rows, v_rows, out, lse, args, stream));
    if (done) return;
  }
  const SplitQkv s = split_qkv(qk_rows, v_rows, args, stream);
  attention_forward(s.q, s.k, s.v, out, lse, args, stream);
}

void attention_backward_packed(const Tensor& dout, const Tensor& qk_rows, const Tensor& v_rows,
                               const Tensor& out, const Tensor& lse, Tensor& dqkv,
                               const AttentionArgs& args, const Stream& stream) {
  const char* op = "attention_backward_packed";
  detail::check_device(op, stream, {&dout, &qk_rows, &v_rows, &out, &lse, &dqkv});
  check_packed(op, qk_rows, args);
  check_packed(op, v_rows, args);
  check_packed(op, dqkv, args);
  if (stream.is_cuda()) {
    bool done = false;
    MDLM_CUDA_BACKEND(done = cuda::attention_backward_packed(dout, qk_rows, v_rows, out, lse, dqkv, args, stream));
    if (done) return;
  }
  const SplitQkv s = split_qkv(qk_rows, v_rows, args, stream);
  SplitQkv g{Tensor::empty(s.q.shape(), qk_rows.dtype(), stream), Tensor::empty(s.k.shape(), qk_rows.dtype(), stream),
             Tensor::empty(s.v.shape(), qk_rows.dtype(), stream)};
  attention_backward(dout, s.q, s.k, s.v, out, lse, g.q, g.k, g.v, args, stream);
  const int64_t t = args.batch * args.seq;
  Tensor rows = dqkv.view({t, dqkv.numel() / t});
  concat_columns({&g.q, &g.k, &g.v}, rows, stream);
}

bool attention_packed_reads_in_place(const AttentionArgs& args, const Stream& stream) {
  if (!stream.is_cuda()) return false;
  bool in_place = false;
  MDLM_CUDA_BACKEND(in_place = cuda::attention_packed_reads_in_place(args));
  return in_place;
}

}  // namespace megadlm::ops
