// parallel/context_parallel/attention.h: the four communication types around the ring and the
// plain attention op.
#include "megadlm/parallel/context_parallel/attention.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/parallel/context_parallel/ring_attention.h"

namespace megadlm::cp {

namespace {

DType stat_dtype(DType activation) { return activation == DType::F64 ? DType::F64 : DType::F32; }

// Block diffusion's local rows are [x_t of the shard | x_0 of the shard] per sample: to the
// layout (SequenceLayout of 2B rows of L positions, see MicroBatch::upload) they are 2B rows
// of the split's local length, to the kernel B doubled rows with chunk-mapped halves.
ops::AttentionArgs layout_view(ops::AttentionArgs a) {
  if (!ops::is_block_diffusion(a.mask)) return a;
  a.batch *= 2;
  a.seq /= 2;
  return a;
}

ops::AttentionArgs kernel_view(ops::AttentionArgs a) {
  if (!ops::is_block_diffusion(a.mask)) return a;
  a.batch /= 2;
  a.seq *= 2;
  return a;
}

/// The all_gather call: this rank's queries against the gathered keys in natural order.
ops::AttentionArgs gathered_args(const ops::AttentionArgs& args, const SequenceLayout& layout,
                                 const Stream& stream) {
  const Split& s = layout.split();
  ops::AttentionArgs a = args;
  a.kv_seq = ops::is_block_diffusion(args.mask) ? 2 * s.seq : s.seq;
  a.query_chunks = s.chunks();
  a.document_ids = layout.documents(s.size, s.rank, stream);
  a.key_document_ids = layout.documents(1, 0, stream);
  a.document_starts = nullptr;  // the caller's are of its local rows
  return a;
}

}  // namespace

ContextParallelAttention::ContextParallelAttention(CommType type, const ModelParallel& mp)
    : type_(type), cp_(mp.cp), side_(mp.cp_side_stream) {
  switch (type) {
    case CommType::P2P: ring_ = mp.cp; break;
    case CommType::A2A: heads_ = mp.cp; break;
    case CommType::AllGather: break;
    case CommType::A2AP2P:
      MDLM_CHECK(mp.hierarchical_cp.size() == 2, "`--cp-comm-type a2a+p2p` needs two levels of "
                 "`--hierarchical-context-parallel-sizes` (all-to-all size, ring size), got ",
                 mp.hierarchical_cp.size());
      heads_ = mp.hierarchical_cp[0];
      ring_ = mp.hierarchical_cp[1];
      MDLM_CHECK(heads_.size * ring_.size == cp_.size, "hierarchical CP levels ", heads_.size,
                 " x ", ring_.size, " do not make the context-parallel size ", cp_.size);
      break;
  }
  if (!side_) side_ = std::make_shared<SideStream>();
}

void ContextParallelAttention::check_layout(const SequenceLayout& layout,
                                            const ops::AttentionArgs& kernel_args) const {
  const ops::AttentionArgs args = layout_view(kernel_args);
  const Split& s = layout.split();
  MDLM_CHECK(s.size == cp_.size && s.rank == cp_.rank, "context-parallel attention: the "
             "micro-batch is split for rank ", s.rank, " of ", s.size, " but this is CP rank ",
             cp_.rank, " of ", cp_.size);
  MDLM_CHECK(args.batch == layout.batch() && args.seq == s.local_len(), "context-parallel "
             "attention: ", args.batch, " x ", args.seq, " rows, the micro-batch has ",
             layout.batch(), " x ", s.local_len());
  if (type_ == CommType::AllGather) return;
  // This rank's place in the level-1 block and the ring (sequence_split.h).
  MDLM_CHECK(heads_.rank == cp_.rank % heads_.size && ring_.rank == cp_.rank / heads_.size,
             "context-parallel attention: CP rank ", cp_.rank, " is rank ", heads_.rank,
             " of its all-to-all group and ", ring_.rank, " of its ring; expected ",
             cp_.rank % heads_.size, " and ", cp_.rank / heads_.size);
  MDLM_CHECK(args.num_heads % heads_.size == 0 && args.num_kv_heads % heads_.size == 0,
             "`--cp-comm-type ", comm_type_name(type_), "` splits ", args.num_heads,
             " query heads and ", args.num_kv_heads, " key/value groups per rank over ",
             heads_.size, " ranks, which does not divide them");
}

ops::AttentionArgs ContextParallelAttention::block_args(const ops::AttentionArgs& args,
                                                        const SequenceLayout& layout) const {
  ops::AttentionArgs a = args;
  const int n = heads_.size;
  a.seq = layout.split().local_len() * n;
  a.num_heads = args.num_heads / n;
  a.num_kv_heads = args.num_kv_heads / n;
  a.head_offset = args.head_offset + heads_.rank * a.num_heads;  // global heads of this block
  return a;
}

Ring ContextParallelAttention::ring(const SequenceLayout& layout, const Stream& stream) const {
  const Split& s = layout.split();
  return Ring{ring_.get(), Split{s.size / heads_.size, s.rank / heads_.size, s.seq}, &layout,
              side_->for_compute(stream)};
}

Tensor ContextParallelAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const ops::AttentionArgs& args,
                                         const SequenceLayout& layout, AttentionSaved& saved,
                                         const Stream& stream) const {
  check_layout(layout, args);
  if (type_ == CommType::AllGather) {
    Tensor k_all = gather_sequence(k, cp_.get(), layout, stream);
    Tensor v_all = gather_sequence(v, cp_.get(), layout, stream);
    const ops::AttentionArgs a = gathered_args(args, layout, stream);
    Tensor out = Tensor::empty(q.shape(), q.dtype(), stream);
    saved.lse = Tensor::empty({args.batch, args.num_heads, args.seq}, stat_dtype(q.dtype()), stream);
    ops::attention_forward(q, k_all, v_all, out, saved.lse, a, stream);
    saved.q = q;
    saved.k = k;
    saved.v = v;
    return out;
  }
  const ops::AttentionArgs a = kernel_view(block_args(layout_view(args), layout));
  saved.q = sequence_to_heads(q, heads_.get(), layout, stream);
  saved.k = sequence_to_heads(k, heads_.get(), layout, stream);
  saved.v = sequence_to_heads(v, heads_.get(), layout, stream);
  saved.lse = Tensor::empty({a.batch, a.num_heads, a.seq}, stat_dtype(q.dtype()), stream);
  Tensor out = Tensor::empty(saved.q.shape(), q.dtype(), stream);
  ring_attention_forward(saved.q, saved.k, saved.v, out, saved.lse, a, ring(layout, stream), stream);
  return heads_to_sequence(out, heads_.get(), layout, stream);
}

void ContextParallelAttention::restore_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const SequenceLayout& layout, AttentionSaved& saved,
                                              const Stream& stream) const {
  if (type_ == CommType::AllGather) {
    saved.q = q;
    saved.k = k;
    saved.v = v;
    return;
  }
  saved.q = sequence_to_heads(q, heads_.get(), layout, stream);
  saved.k = sequence_to_heads(k, heads_.get(), layout, stream);
  saved.v = sequence_to_heads(v, heads_.get(), layout, stream);
}

AttentionGrads ContextParallelAttention::backward(const Tensor& dout, const Tensor& out,
                                                  AttentionSaved& saved,
                                                  const ops::AttentionArgs& args,
                                                  const SequenceLayout& layout,
                                                  const Stream& stream) const {
  check_layout(layout, args);
  AttentionGrads g;
  if (type_ == CommType::AllGather) {
    Tensor k_all = gather_sequence(saved.k, cp_.get(), layout, stream);
    Tensor v_all = gather_sequence(saved.v, cp_.get(), layout, stream);
    const ops::AttentionArgs a = gathered_args(args, layout, stream);
    g.dq = Tensor::empty(saved.q.shape(), saved.q.dtype(), stream);
    Tensor dk_all = Tensor::empty(k_all.shape(), k_all.dtype(), stream);
    Tensor dv_all = Tensor::empty(v_all.shape(), v_all.dtype(), stream);
    ops::attention_backward(dout, saved.q, k_all, v_all, out, saved.lse, g.dq, dk_all, dv_all, a,
                            stream);
    k_all = v_all = Tensor();
    const DType acc = stat_dtype(saved.k.dtype());
    g.dk = Tensor::empty(saved.k.shape(), saved.k.dtype(), stream);
    g.dv = Tensor::empty(saved.v.shape(), saved.v.dtype(), stream);
    ops::copy(reduce_scatter_sequence(dk_all, acc, cp_.get(), layout, stream), g.dk, stream);
    ops::copy(reduce_scatter_sequence(dv_all, acc, cp_.get(), layout, stream), g.dv, stream);
    saved = AttentionSaved{};
    return g;
  }
  const ops::AttentionArgs a = kernel_view(block_args(layout_view(args), layout));
  Tensor dout_b = sequence_to_heads(dout, heads_.get(), layout, stream);
  Tensor out_b = sequence_to_heads(out, heads_.get(), layout, stream);
  Tensor dq = Tensor::empty(saved.q.shape(), saved.q.dtype(), stream);
  Tensor dk = Tensor::empty(saved.k.shape(), saved.k.dtype(), stream);
  Tensor dv = Tensor::empty(saved.v.shape(), saved.v.dtype(), stream);
  ring_attention_backward(dout_b, saved.q, saved.k, saved.v, out_b, saved.lse, dq, dk, dv, a,
                          ring(layout, stream), stream);
  saved = AttentionSaved{};
  dout_b = out_b = Tensor();
  g.dq = heads_to_sequence(dq, heads_.get(), layout, stream);
  g.dk = heads_to_sequence(dk, heads_.get(), layout, stream);
  g.dv = heads_to_sequence(dv, heads_.get(), layout, stream);
  return g;
}

}  // namespace megadlm::cp
