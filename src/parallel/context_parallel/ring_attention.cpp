// parallel/context_parallel/ring_attention.h: the forward and backward rings.
#include "megadlm/parallel/context_parallel/ring_attention.h"
#include <cmath>
#include <utility>
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/parallel/context_parallel/mappings.h"

namespace megadlm::cp {

namespace {

int ring_size(const Ring& r) { return r.group != nullptr ? r.group->size() : 1; }

/// The accumulator dtype for activations of `dtype`: f32, or f64 in f64 gradient checks.
DType accumulator_dtype(DType dtype) { return dtype == DType::F64 ? DType::F64 : DType::F32; }

/// acc += x (x may be narrower: bf16 into f32).
void accumulate(Tensor& acc, const Tensor& x, const Stream& stream) {
  if (x.dtype() == acc.dtype()) {
    ops::add(acc, x, acc, stream);
    return;
  }
  Tensor wide = Tensor::empty(acc.shape(), acc.dtype(), stream);
  ops::copy(x, wide, stream);
  ops::add(acc, wide, acc, stream);
}

void check_ring(const Ring& ring) {
  MDLM_CHECK(ring.layout != nullptr, "cp ring: no sequence layout");
  ring.split.check();
  MDLM_CHECK(ring_size(ring) == ring.split.size &&
                 (ring.group == nullptr || ring.group->rank() == ring.split.rank),
             "cp ring: the ring group (", ring_size(ring), " ranks) does not match the split of ",
             ring.split.size, " shards (rank ", ring.split.rank, ")");
}

/// K/V buffers of the ring: step 0 reads the caller's k, v; later steps alternate between two
/// spare pairs, so the block in flight never lands on the one being read.
struct KvBuffers {
  Tensor k, v;         // the block of the current step
  Tensor spare[2][2];  // [pair][k or v]
  int next_pair = 0;

  KvBuffers(const Tensor& k0, const Tensor& v0, bool need_spares, const Stream& stream) : k(k0), v(v0) {
    if (!need_spares) return;
    for (auto& pair : spare) {
      pair[0] = Tensor::empty(k0.shape(), k0.dtype(), stream);
      pair[1] = Tensor::empty(v0.shape(), v0.dtype(), stream);
    }
  }
  std::vector<Tensor> incoming() const { return {spare[next_pair][0], spare[next_pair][1]}; }
  void advance() {
    k = spare[next_pair][0];
    v = spare[next_pair][1];
    next_pair ^= 1;
  }
};

// ---- causal half blocks -------------------------------------------------------------------
//
// A causal ring block between two different shards pairs whole chunks: a key chunk either
// precedes a query chunk (every pair visible) or follows it (none). With the load-balanced split
// (rank r holds chunks r and 2CP-1-r) the visible pairs take one of two shapes, as Transformer
// Engine's ring does:
//   KeysFirstHalf      (source rank < this rank): every query sees the first key chunk, none the
//                      second;
//   QueriesSecondHalf  (source rank > this rank): the second query chunk sees every key, the
//                      first query chunk none.
// Either runs without a mask on half the block (on CUDA the flash kernels' separate-key path
// instead of the simple kernels' chunk-mapped causal mask); documents and dropout coordinates
// follow the halves. Any other shape (the diagonal block, identity maps) runs whole.
enum class HalfBlock { Whole, KeysFirstHalf, QueriesSecondHalf };

HalfBlock half_block_of(const ops::AttentionArgs& a) {
  const ops::ChunkMap& qc = a.query_chunks;
  const ops::ChunkMap& kc = a.key_chunks;
  if (a.mask != ops::AttentionMask::Causal || qc.identity() || kc.identity() || qc.len != kc.len ||
      a.keys() != a.seq)
    return HalfBlock::Whole;
  for (int64_t q : {qc.first, qc.second})
    for (int64_t k : {kc.first, kc.second})
      if (q == k) return HalfBlock::Whole;  // a diagonal chunk pair needs the mask
  const bool q0k0 = kc.first < qc.first, q0k1 = kc.second < qc.first;
  const bool q1k0 = kc.first < qc.second, q1k1 = kc.second < qc.second;
  if (q0k0 && q1k0 && !q0k1 && !q1k1) return HalfBlock::KeysFirstHalf;
  if (!q0k0 && !q0k1 && q1k0 && q1k1) return HalfBlock::QueriesSecondHalf;
  return HalfBlock::Whole;
}

/// Half `which` (0: the first chunk, 1: the second) of every batch row of x, whose rows hold
/// `batch` equal runs of two chunks each (activations [B, 2 len, ...], statistics [B H, 2 len]).
Tensor half_of(const Tensor& x, int64_t batch, int which, const Stream& stream) {
  const int64_t row = x.numel() / batch;
  Tensor halves[2] = {Tensor::empty({batch, row / 2}, x.dtype(), stream),
                      Tensor::empty({batch, row / 2}, x.dtype(), stream)};
  ops::split_columns(x.view({batch, row}), {&halves[0], &halves[1]}, stream);
  return halves[which];
}

/// into = [first | second] per batch row (shapes as half_of's halves; into keeps its shape).
void join_halves(const Tensor& first, const Tensor& second, Tensor& into, int64_t batch, const Stream& stream) {
  Tensor rows = into.view({batch, into.numel() / batch});
  ops::concat_columns({&first, &second}, rows, stream);
}

/// The unmasked half-block call of `a` (see HalfBlock): shapes, documents, dropout offsets.
ops::AttentionArgs half_block_args(const ops::AttentionArgs& a, HalfBlock h, Tensor& query_docs,
                                   Tensor& key_docs, const Stream& stream) {
  ops::AttentionArgs sub = a;
  sub.mask = ops::AttentionMask::None;
  const int64_t len = a.query_chunks.len;
  if (h == HalfBlock::KeysFirstHalf) {
    sub.kv_seq = len;
    sub.key_offset = a.key_offset + a.key_chunks.first * len;  // dropout coordinates only
    sub.key_chunks = ops::ChunkMap{};
    if (a.key_document_ids != nullptr) {
      key_docs = half_of(*a.key_document_ids, a.batch, 0, stream);
      sub.key_document_ids = &key_docs;
    }
  } else {
    sub.seq = len;
    sub.kv_seq = 2 * len;
    sub.query_offset = a.query_offset + a.query_chunks.second * len;
    sub.query_chunks = ops::ChunkMap{};
    if (a.document_ids != nullptr) {
      query_docs = half_of(*a.document_ids, a.batch, 1, stream);
      sub.document_ids = &query_docs;
    }
  }
  return sub;
}

/// attention_forward of a causal cross-shard block by its visible half (out, lse full size:
/// the queries that see nothing get out 0 and lse -inf, as the masked call gives them).
void half_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                        const ops::AttentionArgs& a, HalfBlock h, const Stream& stream) {
  Tensor query_docs, key_docs;
  const ops::AttentionArgs sub = half_block_args(a, h, query_docs, key_docs, stream);
  if (h == HalfBlock::KeysFirstHalf) {
    ops::attention_forward(q, half_of(k, a.batch, 0, stream), half_of(v, a.batch, 0, stream), out, lse, sub,
                           stream);
    return;
  }
  const int64_t stats_rows = a.batch * a.num_heads;
  Tensor out1 = Tensor::empty({a.batch, out.numel() / a.batch / 2}, out.dtype(), stream);
  Tensor lse1 = Tensor::empty({stats_rows, a.seq / 2}, lse.dtype(), stream);
  ops::attention_forward(half_of(q, a.batch, 1, stream), k, v, out1, lse1, sub, stream);
  Tensor out0 = Tensor::zeros(out1.shape(), out.dtype(), stream);
  Tensor lse0 = Tensor::empty(lse1.shape(), lse.dtype(), stream);
  ops::fill(lse0, -INFINITY, stream);
  join_halves(out0, out1, out, a.batch, stream);
  join_halves(lse0, lse1, lse, stats_rows, stream);
}

/// attention_backward of a causal cross-shard block by its visible half (dq, dk, dv full size,
/// zero where the block has no visible pair).
void half_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                         const ops::AttentionArgs& a, HalfBlock h, const Stream& stream) {
  Tensor query_docs, key_docs;
  const ops::AttentionArgs sub = half_block_args(a, h, query_docs, key_docs, stream);
  if (h == HalfBlock::KeysFirstHalf) {
    const Tensor k0 = half_of(k, a.batch, 0, stream), v0 = half_of(v, a.batch, 0, stream);
    Tensor dk0 = Tensor::empty(k0.shape(), dk.dtype(), stream), dv0 = Tensor::empty(v0.shape(), dv.dtype(), stream);
    ops::attention_backward(dout, q, k0, v0, out, lse, dq, dk0, dv0, sub, stream);
    const Tensor zeros = Tensor::zeros(k0.shape(), dk.dtype(), stream);
    join_halves(dk0, zeros, dk, a.batch, stream);
    join_halves(dv0, zeros, dv, a.batch, stream);
    return;
  }
  const int64_t stats_rows = a.batch * a.num_heads;
  const Tensor q1 = half_of(q, a.batch, 1, stream);
  Tensor dq1 = Tensor::empty(q1.shape(), dq.dtype(), stream);
  ops::attention_backward(half_of(dout, a.batch, 1, stream), q1, k, v, half_of(out, a.batch, 1, stream),
                          half_of(lse.view({stats_rows, a.seq}), stats_rows, 1, stream), dq1, dk, dv, sub, stream);
  join_halves(Tensor::zeros(dq1.shape(), dq.dtype(), stream), dq1, dq, a.batch, stream);
}

// ---- block diffusion steps ---------------------------------------------------------------
//
// A shard's rows per batch row are four chunks of c rows: [noisy a | noisy b | clean a | clean b]
// (a = first chunk, b = second). Its own block runs on its local ranges (whole-row call). When
// every block lies in one chunk, the block of another shard's keys sees only their clean copies,
// and only those of chunks before the query's chunk (a noisy query's block and a clean query's
// block end inside its own chunk), each in its document: with the load-balanced split
//   src < me: every query sees the keys' clean chunk a (BdStep::EarlierKeys), none clean b;
//   src > me: the queries of chunk b (noisy and clean) see both clean chunks (LaterQueries).
// Those run unmasked but for document ids (block_documents), one call per query half so that
// the ids of every call are non-decreasing along the rows.
enum class BdStep { General, Own, EarlierKeys, LaterQueries };

BdStep bd_step_of(const Ring& ring, int src) {
  const int me = ring.split.rank;
  if (src == me) return BdStep::Own;
  if (!ring.layout->block_diffusion() || !ring.layout->blocks_in_chunks(ring.split.size)) return BdStep::General;
  return src < me ? BdStep::EarlierKeys : BdStep::LaterQueries;
}

/// Column block `which` of `parts` equal blocks of every batch row of x (rows of `batch`).
Tensor part_of(const Tensor& x, int64_t batch, int parts, int which, const Stream& stream) {
  const int64_t row = x.numel() / batch;
  std::vector<Tensor> p;
  std::vector<Tensor*> outs;
  for (int i = 0; i < parts; ++i) p.push_back(Tensor::empty({batch, row / parts}, x.dtype(), stream));
  for (auto& t : p) outs.push_back(&t);
  ops::split_columns(x.view({batch, row}), outs, stream);
  return p[static_cast<size_t>(which)];
}

/// into = [parts...] per batch row (into keeps its shape).
void join_parts(const std::vector<const Tensor*>& parts, Tensor& into, int64_t batch, const Stream& stream) {
  Tensor rows = into.view({batch, into.numel() / batch});
  ops::concat_columns(parts, rows, stream);
}

/// The unmasked call of query rows with `qdocs` against key rows with `kdocs` (both [B, rows]).
ops::AttentionArgs bd_key_block_args(const ops::AttentionArgs& a, int64_t q_rows, int64_t k_rows,
                                     const Tensor& qdocs, const Tensor& kdocs) {
  ops::AttentionArgs sub = a;
  sub.mask = ops::AttentionMask::None;
  sub.block_ranges = nullptr;
  sub.seq = q_rows;
  sub.kv_seq = k_rows;
  sub.query_chunks = sub.key_chunks = ops::ChunkMap{};
  sub.document_ids = &qdocs;
  sub.key_document_ids = &kdocs;
  sub.document_starts = nullptr;
  return sub;
}

ops::AttentionArgs bd_own_args(const ops::AttentionArgs& a, const Ring& ring, const Stream& stream) {
  ops::AttentionArgs own = a;
  own.query_chunks = own.key_chunks = ops::ChunkMap{};
  own.block_ranges = &ring.layout->local_block_ranges(ring.split.size, ring.split.rank, stream);
  return own;
}

void bd_step_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                     const ops::AttentionArgs& a, const Ring& ring, int src, BdStep step,
                     const Stream& stream) {
  const int64_t B = a.batch, c = a.seq / 4, stats = B * a.num_heads;
  const Tensor& qd_all = ring.layout->block_documents(ring.split.size, ring.split.rank, stream);
  const Tensor& kd_all = ring.layout->block_documents(ring.split.size, src, stream);
  if (step == BdStep::EarlierKeys) {  // every query against the keys' clean chunk a
    const Tensor kd = part_of(kd_all, B, 4, 2, stream);
    const Tensor k2 = part_of(k, B, 4, 2, stream), v2 = part_of(v, B, 4, 2, stream);
    Tensor o[2], l[2];
    for (int half = 0; half < 2; ++half) {
      const Tensor qd = part_of(qd_all, B, 2, half, stream);
      o[half] = Tensor::empty({B, out.numel() / B / 2}, out.dtype(), stream);
      l[half] = Tensor::empty({stats, a.seq / 2}, lse.dtype(), stream);
      ops::attention_forward(part_of(q, B, 2, half, stream), k2, v2, o[half], l[half],
                             bd_key_block_args(a, 2 * c, c, qd, kd), stream);
    }
    join_parts({&o[0], &o[1]}, out, B, stream);
    join_parts({&l[0], &l[1]}, lse, stats, stream);
    return;
  }
  // LaterQueries: the queries of chunk b (noisy, clean) against both clean chunks.
  const Tensor kd = part_of(kd_all, B, 2, 1, stream);
  const Tensor kc = part_of(k, B, 2, 1, stream), vc = part_of(v, B, 2, 1, stream);
  Tensor o[2], l[2];
  for (int half = 0; half < 2; ++half) {
    const int which = 2 * half + 1;
    const Tensor qd = part_of(qd_all, B, 4, which, stream);
    o[half] = Tensor::empty({B, out.numel() / B / 4}, out.dtype(), stream);
    l[half] = Tensor::empty({stats, c}, lse.dtype(), stream);
    ops::attention_forward(part_of(q, B, 4, which, stream), kc, vc, o[half], l[half],
                           bd_key_block_args(a, c, 2 * c, qd, kd), stream);
  }
  const Tensor zero = Tensor::zeros(o[0].shape(), out.dtype(), stream);
  Tensor none = Tensor::empty(l[0].shape(), lse.dtype(), stream);
  ops::fill(none, -INFINITY, stream);
  join_parts({&zero, &o[0], &zero, &o[1]}, out, B, stream);
  join_parts({&none, &l[0], &none, &l[1]}, lse, stats, stream);
}

void bd_step_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                      const ops::AttentionArgs& a, const Ring& ring, int src, BdStep step,
                      const Stream& stream) {
  const int64_t B = a.batch, c = a.seq / 4, stats = B * a.num_heads;
  const Tensor& qd_all = ring.layout->block_documents(ring.split.size, ring.split.rank, stream);
  const Tensor& kd_all = ring.layout->block_documents(ring.split.size, src, stream);
  const Tensor lse_rows = lse.view({stats, a.seq});
  const bool earlier = step == BdStep::EarlierKeys;
  const int parts = earlier ? 2 : 4;  // the query rows of a call: a half, or a chunk
  const Tensor kd = earlier ? part_of(kd_all, B, 4, 2, stream) : part_of(kd_all, B, 2, 1, stream);
  const Tensor kx = earlier ? part_of(k, B, 4, 2, stream) : part_of(k, B, 2, 1, stream);
  const Tensor vx = earlier ? part_of(v, B, 4, 2, stream) : part_of(v, B, 2, 1, stream);
  Tensor dq_part[2], dk_sum, dv_sum;
  for (int half = 0; half < 2; ++half) {
    const int which = earlier ? half : 2 * half + 1;
    const Tensor qx = part_of(q, B, parts, which, stream);
    const Tensor qd = part_of(qd_all, B, parts, which, stream);
    dq_part[half] = Tensor::empty(qx.shape(), dq.dtype(), stream);
    Tensor dkx = Tensor::empty(kx.shape(), dk.dtype(), stream), dvx = Tensor::empty(vx.shape(), dv.dtype(), stream);
    ops::attention_backward(part_of(dout, B, parts, which, stream), qx, kx, vx,
                            part_of(out, B, parts, which, stream),
                            part_of(lse_rows, stats, parts, which, stream), dq_part[half], dkx, dvx,
                            bd_key_block_args(a, earlier ? 2 * c : c, earlier ? c : 2 * c, qd, kd),
                            stream);
    if (half == 0) {
      dk_sum = dkx;
      dv_sum = dvx;
    } else {
      ops::add(dk_sum, dkx, dk_sum, stream);
      ops::add(dv_sum, dvx, dv_sum, stream);
    }
  }
  if (earlier) {
    join_parts({&dq_part[0], &dq_part[1]}, dq, B, stream);
    const Tensor zero = Tensor::zeros(dk_sum.shape(), dk.dtype(), stream);
    join_parts({&zero, &zero, &dk_sum, &zero}, dk, B, stream);
    join_parts({&zero, &zero, &dv_sum, &zero}, dv, B, stream);
    return;
  }
  const Tensor zq = Tensor::zeros(dq_part[0].shape(), dq.dtype(), stream);
  join_parts({&zq, &dq_part[0], &zq, &dq_part[1]}, dq, B, stream);
  const Tensor zk = Tensor::zeros(dk_sum.shape(), dk.dtype(), stream);
  join_parts({&zk, &dk_sum}, dk, B, stream);
  join_parts({&zk, &dv_sum}, dv, B, stream);
}

}  // namespace

void ring_step_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                       const ops::AttentionArgs& args, const Ring& ring, int src, const Stream& stream) {
  const ops::AttentionArgs a = ring_block_args(args, ring, src, stream);
  const BdStep step = ops::is_block_diffusion(a.mask) && ring.layout->block_diffusion() ? bd_step_of(ring, src)
                                                                                        : BdStep::General;
  if (step == BdStep::Own) ops::attention_forward(q, k, v, out, lse, bd_own_args(a, ring, stream), stream);
  else if (step != BdStep::General) bd_step_forward(q, k, v, out, lse, a, ring, src, step, stream);
  else ring_block_forward(q, k, v, out, lse, a, stream);
}

void ring_step_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                        const ops::AttentionArgs& args, const Ring& ring, int src, const Stream& stream) {
  const ops::AttentionArgs a = ring_block_args(args, ring, src, stream);
  const BdStep step = ops::is_block_diffusion(a.mask) && ring.layout->block_diffusion() ? bd_step_of(ring, src)
                                                                                        : BdStep::General;
  if (step == BdStep::Own)
    ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, bd_own_args(a, ring, stream), stream);
  else if (step != BdStep::General)
    bd_step_backward(dout, q, k, v, out, lse, dq, dk, dv, a, ring, src, step, stream);
  else
    ring_block_backward(dout, q, k, v, out, lse, dq, dk, dv, a, stream);
}

void ring_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                        const ops::AttentionArgs& block, const Stream& stream) {
  if (const HalfBlock h = half_block_of(block); h != HalfBlock::Whole)
    half_block_forward(q, k, v, out, lse, block, h, stream);
  else
    ops::attention_forward(q, k, v, out, lse, block, stream);
}

void ring_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                         const ops::AttentionArgs& block, const Stream& stream) {
  if (const HalfBlock h = half_block_of(block); h != HalfBlock::Whole)
    half_block_backward(dout, q, k, v, out, lse, dq, dk, dv, block, h, stream);
  else
    ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, block, stream);
}

ops::AttentionArgs ring_block_args(const ops::AttentionArgs& local, const Ring& ring, int src,
                                   const Stream& stream) {
  ops::AttentionArgs a = local;
  const Split& s = ring.split;
  // Block diffusion: both halves of the shard's doubled rows, each chunk-mapped (ops/attention.h).
  a.seq = ops::is_block_diffusion(local.mask) ? 2 * s.local_len() : s.local_len();
  a.kv_seq = 0;
  a.query_chunks = s.chunks();
  a.key_chunks = s.of_rank(src).chunks();
  a.document_ids = ring.layout->documents(s.size, s.rank, stream);
  a.key_document_ids = src == s.rank ? nullptr : ring.layout->documents(s.size, src, stream);
  a.document_starts = nullptr;  // the caller's are of its local rows, not of this layout
  return a;
}

void ring_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                            Tensor& lse, const ops::AttentionArgs& args, const Ring& ring,
                            const Stream& stream) {
  check_ring(ring);
  const int n = ring.split.size, me = ring.split.rank;
  if (n == 1) {  // one block: plain attention (the a2a case)
    ops::attention_forward(q, k, v, out, lse, ring_block_args(args, ring, me, stream), stream);
    return;
  }
  const DType acc = accumulator_dtype(q.dtype());
  const int64_t rows = ops::is_block_diffusion(args.mask) ? 2 * ring.split.local_len()
                                                          : ring.split.local_len();
  const ops::AttentionMergeArgs merge{args.batch, rows, args.num_heads, args.head_dim};
  Tensor acc_out = Tensor::zeros(q.shape(), acc, stream);
  Tensor acc_lse = Tensor::empty(lse.shape(), lse.dtype(), stream);
  ops::fill(acc_lse, -INFINITY, stream);
  Tensor block_out = Tensor::empty(q.shape(), q.dtype(), stream);
  Tensor block_lse = Tensor::empty(lse.shape(), lse.dtype(), stream);
  KvBuffers kv(k, v, true, stream);
  RingTransfer transfer;
  for (int i = 0; i < n; ++i) {
    const int src = (me - i + n) % n;
    const bool more = i + 1 < n;
    if (more) transfer.start(*ring.group, {kv.k, kv.v}, kv.incoming(), stream, ring.side);
    ring_step_forward(q, kv.k, kv.v, block_out, block_lse, args, ring, src, stream);
    ops::attention_merge(acc_out, acc_lse, block_out, block_lse, merge, stream);
    if (more) {
      transfer.finish(stream);
      kv.advance();
    }
  }
  ops::copy(acc_out, out, stream);
  ops::copy(acc_lse, lse, stream);
}

void ring_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, Tensor& dq,
                             Tensor& dk, Tensor& dv, const ops::AttentionArgs& args,
                             const Ring& ring, const Stream& stream) {
  check_ring(ring);
  const int n = ring.split.size, me = ring.split.rank;
  if (n == 1) {
    ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv,
                            ring_block_args(args, ring, me, stream), stream);
    return;
  }
  const DType acc = accumulator_dtype(q.dtype());
  Tensor dq_acc = Tensor::zeros(q.shape(), acc, stream);
  // dK/dV accumulators: [0] starts as this rank's (zero), then they alternate with the block
  // they belong to; after the last step the one received is this rank's own, complete.
  Tensor dkv[2][2] = {{Tensor::zeros(k.shape(), acc, stream), Tensor::zeros(v.shape(), acc, stream)},
                      {Tensor::empty(k.shape(), acc, stream), Tensor::empty(v.shape(), acc, stream)}};
  int cur = 0;
  Tensor dq_b = Tensor::empty(q.shape(), q.dtype(), stream);
  Tensor dk_b = Tensor::empty(k.shape(), k.dtype(), stream);
  Tensor dv_b = Tensor::empty(v.shape(), v.dtype(), stream);
  KvBuffers kv(k, v, true, stream);
  RingTransfer kv_transfer, grad_transfer;
  for (int i = 0; i < n; ++i) {
    const int src = (me - i + n) % n;
    const bool more = i + 1 < n;
    if (more) kv_transfer.start(*ring.group, {kv.k, kv.v}, kv.incoming(), stream, ring.side);
    ring_step_backward(dout, q, kv.k, kv.v, out, lse, dq_b, dk_b, dv_b, args, ring, src, stream);
    accumulate(dq_acc, dq_b, stream);
    // The accumulator of this step's block arrived during this step's compute (step 0: our own,
    // zero); once it is here, the previous step's send from the other buffer is done too.
    grad_transfer.finish(stream);
    accumulate(dkv[cur][0], dk_b, stream);
    accumulate(dkv[cur][1], dv_b, stream);
    // The block's gradient goes on with it, in flight during the next step's compute; the one
    // arriving belongs to the next step's block (after the last step: to this rank's own K/V).
    grad_transfer.start(*ring.group, {dkv[cur][0], dkv[cur][1]}, {dkv[cur ^ 1][0], dkv[cur ^ 1][1]},
                        stream, ring.side);
    cur ^= 1;
    if (more) {
      kv_transfer.finish(stream);
      kv.advance();
    }
  }
  grad_transfer.finish(stream);
  ops::copy(dq_acc, dq, stream);
  ops::copy(dkv[cur][0], dk, stream);
  ops::copy(dkv[cur][1], dv, stream);
}

}  // namespace megadlm::cp
