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

}  // namespace

ops::AttentionArgs ring_block_args(const ops::AttentionArgs& local, const Ring& ring, int src,
                                   const Stream& stream) {
  ops::AttentionArgs a = local;
  const Split& s = ring.split;
  a.seq = s.local_len();
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
  const ops::AttentionMergeArgs merge{args.batch, ring.split.local_len(), args.num_heads,
                                      args.head_dim};
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
    ops::attention_forward(q, kv.k, kv.v, block_out, block_lse,
                           ring_block_args(args, ring, src, stream), stream);
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
    ops::attention_backward(dout, q, kv.k, kv.v, out, lse, dq_b, dk_b, dv_b,
                            ring_block_args(args, ring, src, stream), stream);
    accumulate(dq_acc, dq_b, stream);
    accumulate(dkv[cur][0], dk_b, stream);
    accumulate(dkv[cur][1], dv_b, stream);
    // The block's gradient goes on with it; the one arriving belongs to the next step's block
    // (after the last step: to this rank's own K/V).
    grad_transfer.start(*ring.group, {dkv[cur][0], dkv[cur][1]}, {dkv[cur ^ 1][0], dkv[cur ^ 1][1]},
                        stream, ring.side);
    grad_transfer.finish(stream);
    cur ^= 1;
    if (more) {
      kv_transfer.finish(stream);
      kv.advance();
    }
  }
  ops::copy(dq_acc, dq, stream);
  ops::copy(dkv[cur][0], dk, stream);
  ops::copy(dkv[cur][1], dv, stream);
}

}  // namespace megadlm::cp
