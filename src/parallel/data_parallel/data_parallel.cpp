#include "megadlm/parallel/data_parallel/data_parallel.h"
#include <algorithm>
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/data_parallel/grad_norm_runs.h"

namespace megadlm {

DataParallelGroups DataParallelGroups::without_single_ranks() const {
  DataParallelGroups out = *this;
  for (std::shared_ptr<comm::Communicator>* g :
       {&out.inter, &out.tp, &out.pp, &out.embedding, &out.expert.dp, &out.expert.ep, &out.expert.tp})
    if (*g && (*g)->size() == 1) g->reset();
  return out;
}

double DataParallelGroups::global_sq_norm(const NormSums& sums, comm::Communicator* dense_shards,
                                          comm::Communicator* expert_shards, bool has_experts,
                                          const Stream& stream) const {
  auto sum_over = [&](comm::Communicator* c, double v) { return c ? sum_over_ranks(*c, v, stream) : v; };
  const double dense = sum_over(tp.get(), sum_over(dense_shards, sums.dense(!tp || tp->rank() == 0)));
  double experts = 0;
  // Expert parameters: shards over expert-dp, other experts over EP, slices over expert TP.
  // (Every rank of these groups holds the same layers, so all of them take this branch.)
  if (has_experts) {
    const ExpertGradGroups& e = expert;
    experts = sum_over(expert_shards, sums.expert(!e.tp || e.tp->rank() == 0));
    experts = sum_over(e.tp.get(), sum_over(e.ep.get(), experts));
  }
  return sum_over(pp.get(), dense + experts);  // stages hold disjoint parameters
}

BufferLayout DataParallel::buffer_layout(const DataParallelOptions& o, int dp_size, int expert_dp_size) {
  BufferLayout l;
  if (o.overlap_grad_reduce) {
    l.bucket_size = o.bucket_size > 0 ? o.bucket_size
                                      : std::max<int64_t>(40'000'000, 1'000'000LL * dp_size);
  } else {
    l.bucket_size = o.bucket_size;  // 0: one bucket
  }
  // Under the distributed optimizer every bucket splits into dp equal, 64-aligned shards.
  l.bucket_multiple = o.distributed_optimizer ? 64LL * dp_size : 64;
  if (expert_dp_size <= 0) expert_dp_size = dp_size;
  l.expert_bucket_multiple = o.distributed_optimizer ? 64LL * expert_dp_size : 64;
  return l;
}

DataParallel::DataParallel(ParameterStore& store, std::shared_ptr<comm::Communicator> group,
                           DataParallelOptions options, const Stream& compute, DataParallelGroups groups)
    : store_(store), group_(std::move(group)), groups_(groups.without_single_ranks()), opt_(options),
      compute_(compute) {
  MDLM_CHECK(!groups_.inter || opt_.distributed_optimizer,
             "several distributed-optimizer instances need the distributed optimizer");
  MDLM_CHECK(store.materialized(), "DataParallel needs a materialised parameter store");
  size_ = group_ ? group_->size() : 1;
  rank_ = group_ ? group_->rank() : 0;
  const auto& buckets = store.buckets();
  bool any_expert = false;
  for (const GradBucket& b : buckets) any_expert |= b.expert;
  MDLM_CHECK(!any_expert || !groups_.inter, "expert parameters with several distributed-optimizer "
             "instances are not supported");
  const int most = std::max(size_, groups_.expert.dp ? groups_.expert.dp->size() : 1);
  // A second stream only where it buys overlap: CUDA with more than one rank.
  overlap_ = compute.is_cuda() && most > 1 && (opt_.overlap_grad_reduce || opt_.overlap_param_gather);
  comm_ = overlap_ ? Stream::create(compute.device()) : compute;
  if (opt_.distributed_optimizer) {
    int64_t compact = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const GradBucket& b = buckets[i];
      const int64_t len = b.end - b.begin;
      const int n = group_size(i);
      const int r = group_of(i) ? group_of(i)->rank() : 0;
      MDLM_CHECK(len % n == 0, "bucket of ", len, " elements does not split into ", n,
                 " shards (materialise the store with DataParallel::buffer_layout)");
      const int64_t shard = len / n;
      owned_.push_back({b.begin + r * shard, b.begin + (r + 1) * shard, compact});
      compact += shard;
    }
    grad_shards_ = Tensor::zeros({std::max<int64_t>(compact, 1)}, store.flat_grads().dtype(), compute);
  } else {
    owned_.push_back({0, store.flat_size(), 0});
  }
  pending_.assign(buckets.size(), 0);
  launched_.assign(buckets.size(), false);
  deferred_.assign(buckets.size(), false);
  if (groups_.embedding)
    for (size_t b = 0; b < buckets.size(); ++b)
      for (int h : buckets[b].params)
        if (store.desc(h).pipeline_share != PipelineShare::None) deferred_[b] = true;
  param_ready_.assign(buckets.size(), true);
  for (size_t i = 0; i < buckets.size(); ++i) done_.push_back(Event::create(compute.device()));
}

comm::Communicator* DataParallel::group_of(size_t b) const {
  return store_.buckets()[b].expert ? groups_.expert.dp.get() : group_.get();
}

int DataParallel::group_size(size_t b) const {
  comm::Communicator* g = group_of(b);
  return g ? g->size() : 1;
}

template <typename Fn>
void DataParallel::for_each_owned_piece(Fn&& fn) const {
  for (const OwnedRange& r : owned_) {
    for (size_t i = 0; i < store_.descs().size(); ++i) {
      const ParamDesc& d = store_.descs()[i];
      const int64_t b = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
      if (b < e) fn(d, r.compact_offset + (b - r.begin), b, e - b);
    }
  }
}

std::string DataParallel::summary() const {
  std::string s;
  if (opt_.distributed_optimizer) s += ", distributed optimizer";
  if (opt_.overlap_grad_reduce) s += ", overlapped gradient reduction";
  return s;
}

Tensor DataParallel::optimizer_grads() const {
  return opt_.distributed_optimizer ? grad_shards_ : store_.flat_grads();
}

void DataParallel::start_step() {
  last_micro_batch_ = false;
  const auto& buckets = store_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    pending_[b] = static_cast<int>(buckets[b].params.size());
    launched_[b] = false;
  }
}

void DataParallel::grads_ready(const std::vector<int>& handles) {
  if (!last_micro_batch_ || !opt_.overlap_grad_reduce) return;  // Megatron's no_sync otherwise
  for (int h : handles) {
    const auto b = static_cast<size_t>(store_.bucket_of(h));
    if (--pending_[b] == 0 && !deferred_[b]) launch_bucket(b);
  }
}

void DataParallel::launch_bucket(size_t b) {
  MDLM_CHECK(!launched_[b], "bucket ", b, " reduced twice in one step");
  launched_[b] = true;
  const GradBucket& bucket = store_.buckets()[b];
  comm::Communicator* group = group_of(b);
  const int n = group_size(b);
  comm::Communicator* inter = bucket.expert ? nullptr : groups_.inter.get();
  Tensor grads = store_.flat_grads().slice_flat(bucket.begin, {bucket.end - bucket.begin});
  if (n == 1 && !inter) {
    if (opt_.distributed_optimizer) {  // one rank owns the bucket: the "shard" is all of it
      const OwnedRange& r = owned_[b];
      Tensor shard = grad_shards_.slice_flat(r.compact_offset, {r.end - r.begin});
      copy_tensor(grads, shard, compute_);
    }
    return;
  }
  const Stream& s = comm_stream();
  if (overlap_) {
    Event ready = Event::create(compute_.device());
    ready.record(compute_);
    ready.wait_on(s);
  }
  if (opt_.distributed_optimizer) {
    const OwnedRange& r = owned_[b];
    Tensor shard = grad_shards_.slice_flat(r.compact_offset, {r.end - r.begin});
    if (n > 1) {
      group->reduce_scatter(grads, shard, comm::ReduceOp::Sum, s);
    } else {
      copy_tensor(grads, shard, s);
    }
    if (inter) inter->all_reduce(shard, comm::ReduceOp::Sum, s);
  } else {
    group->all_reduce(grads, comm::ReduceOp::Sum, s);
  }
  done_[b].record(s);
}

void DataParallel::finish_grad_sync() {
  finish_param_gather();  // every block has waited for its bucket by now; settle the bookkeeping
  // After the pipeline flush: the two copies of a tied embedding sum their gradients (on both
  // stages alike) before their bucket reduces over DP. Sums commute, so the order is free.
  reduce_embedding_group_grads();
  for (size_t b = 0; b < launched_.size(); ++b)
    if (!launched_[b]) launch_bucket(b);
  if (overlap_) {
    // The timeout names a hung bucket collective.
    if (group_) group_->synchronize(comm_);
    if (groups_.expert.dp) groups_.expert.dp->synchronize(comm_);
    if (groups_.inter) groups_.inter->synchronize(comm_);
    for (size_t b = 0; b < done_.size(); ++b)
      if (group_size(b) > 1 || (groups_.inter && !store_.buckets()[b].expert)) done_[b].wait_on(compute_);
  }
  reduce_tp_partial_grads();
}

void DataParallel::reduce_embedding_group_grads() {
  if (!groups_.embedding) return;
  for (size_t i = 0; i < store_.descs().size(); ++i) {
    if (store_.descs()[i].pipeline_share == PipelineShare::None) continue;
    Tensor g = store_.grad(static_cast<int>(i));
    Tensor flat = g.view({g.numel()});
    groups_.embedding->all_reduce(flat, comm::ReduceOp::Sum, compute_);
  }
}

void DataParallel::reduce_tp_partial_grads() {
  if (!groups_.tp) return;
  // Sums commute: reducing over TP after DP gives the same total as before it. Every TP rank
  // has the same flat layout and shard ranges, so the pieces line up across the group.
  Tensor g = optimizer_grads();
  for_each_owned_piece([&](const ParamDesc& d, int64_t compact, int64_t, int64_t count) {
    if (!d.tp.partial_grad) return;
    Tensor piece = g.slice_flat(compact, {count});
    groups_.tp->all_reduce(piece, comm::ReduceOp::Sum, compute_);
  });
}

double DataParallel::grad_sq_norm() {
  Tensor g = optimizer_grads();
  bool has_copy = false;  // a tied embedding's last-stage copy is counted on the first stage only
  for (const ParamDesc& d : store_.descs()) has_copy |= d.pipeline_share == PipelineShare::Copy;
  bool has_experts = false;
  for (const GradBucket& b : store_.buckets()) has_experts |= b.expert;
  std::vector<NormPiece> pieces;
  if (!groups_.tp && !has_copy && !has_experts) {
    // No TP group, tied copy or experts: all of the buffer counts, as one piece.
    pieces.push_back({.offset = 0, .count = g.numel(), .target = kNormSplit});
  } else {
    // One sum_squares per run of touching pieces with the same accumulator (grad_norm_runs.h).
    for_each_owned_piece([&](const ParamDesc& d, int64_t compact, int64_t, int64_t count) {
      if (d.pipeline_share == PipelineShare::Copy) return;
      const int target =
          norm_target(d, {.tp = groups_.tp != nullptr, .expert_tp = groups_.expert.tp != nullptr});
      pieces.push_back({.offset = compact, .count = count, .target = target});
    });
  }
  // Shards of one instance are disjoint and cover the model once: the global norm is their sum
  // (the other instances hold the same values); full replicas are already global.
  const bool sharded = opt_.distributed_optimizer;
  return groups_.global_sq_norm(sum_norm_pieces(g, std::move(pieces), compute_),
                                sharded && size_ > 1 ? group_.get() : nullptr,
                                sharded ? groups_.expert.dp.get() : nullptr, has_experts, compute_);
}

void DataParallel::start_param_gather() {
  if (!opt_.distributed_optimizer) return;
  const auto& buckets = store_.buckets();
  bool any = false;
  for (size_t b = 0; b < buckets.size(); ++b) any |= group_size(b) > 1;
  if (!any) return;
  if (fp8_) {  // the shard casts and the gather in stream order (the CPU backend only so far)
    gather_with_fp8_weights(compute_);
    gather_in_flight_ = true;
    finish_param_gather();
    return;
  }
  const Stream& s = opt_.overlap_param_gather && overlap_ ? comm_ : compute_;
  if (&s != &compute_) {
    Event stepped = Event::create(compute_.device());
    stepped.record(compute_);
    stepped.wait_on(s);
  }
  Tensor params = store_.flat_params();
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (group_size(b) == 1) continue;
    const OwnedRange& r = owned_[b];
    Tensor full = params.slice_flat(buckets[b].begin, {buckets[b].end - buckets[b].begin});
    Tensor mine = params.slice_flat(r.begin, {r.end - r.begin});
    group_of(b)->all_gather(mine, full, s);
    done_[b].record(s);
    param_ready_[b] = false;
  }
  gather_in_flight_ = true;
  if (&s == &compute_) finish_param_gather();
}

void DataParallel::set_fp8_param_gather(std::shared_ptr<Fp8State> state) {
  MDLM_CHECK(opt_.distributed_optimizer, "--fp8-param-gather needs the distributed optimizer");
  MDLM_CHECK(state && state->settings().param_gather, "set_fp8_param_gather without --fp8-param-gather");
  MDLM_CHECK(!compute_.is_cuda(), "--fp8-param-gather runs on the CPU backend only so far (docs/fp8.md)");
  fp8_ = std::move(state);
}

// --fp8-param-gather. Each rank casts its shard of every FP8 linear's weight to FP8 with the
// scale of the coming step and the gather moves the codes; they are the codes the linear would
// get by casting the gathered weight (the cast is elementwise, the scale the same):
//  - delayed: the scale is fixed for the step (the trainer runs Fp8State::finish_step before
//    this); each shard cast raises this rank's share of the weight's amax, which begin_step
//    hands to the coming step (finish_step's MAX over TP and the gradient group completes it).
//  - tensorwise: the amax of the whole weight, MAX over the shards (this group) and TP, one
//    packed all-reduce per group for all weights, then the scales.
// The parameters that are not FP8 weights (norms, biases, embedding, head, bf16 layers,
// experts) are gathered in the parameter dtype as without the flag.
void DataParallel::gather_with_fp8_weights(const Stream& s) {
  Fp8State& st = *fp8_;
  std::vector<Fp8State::GatheredWeight>& ws = st.gathered_weights();
  const auto& buckets = store_.buckets();
  Tensor params = store_.flat_params();
  const auto n = static_cast<int64_t>(ws.size());
  struct Span {
    int64_t begin = 0, end = 0;  // flat range of the weight
    size_t bucket = 0;
    int64_t own_begin = 0, own_end = 0;  // the piece this rank owns (may be empty)
  };
  std::vector<Span> spans(ws.size());
  std::vector<int> weight_of(store_.descs().size(), -1);
  for (size_t k = 0; k < ws.size(); ++k) {
    const ParamDesc& f = store_.desc(ws[k].first);
    const ParamDesc& l = store_.desc(ws[k].last);
    Span& sp = spans[k];
    sp.begin = f.offset;
    sp.end = l.offset + l.numel();
    sp.bucket = static_cast<size_t>(store_.bucket_of(ws[k].first));
    MDLM_CHECK(static_cast<size_t>(store_.bucket_of(ws[k].last)) == sp.bucket && !buckets[sp.bucket].expert,
               "--fp8-param-gather: the weight ", f.name, " spans two buckets");
    const OwnedRange& r = owned_[sp.bucket];
    sp.own_begin = std::max(sp.begin, r.begin);
    sp.own_end = std::max(sp.own_begin, std::min(sp.end, r.end));
    for (int h = ws[k].first; h <= ws[k].last; ++h) weight_of[static_cast<size_t>(h)] = static_cast<int>(k);
  }
  const ops::Fp8Type type = st.settings().fwd_type;
  auto own_piece = [&](size_t k) {
    const Span& sp = spans[k];
    return params.slice_flat(sp.own_begin, {1, sp.own_end - sp.own_begin});
  };
  // The scales: delayed from the state; tensorwise from the reduced amaxes of the shards.
  Tensor amax = Tensor::zeros({std::max<int64_t>(n, 1), 1}, DType::F32, compute_);
  std::vector<Tensor> scale(ws.size());
  if (st.delayed()) {
    for (size_t k = 0; k < ws.size(); ++k) scale[k] = st.scale(ws[k].slot, compute_);
  } else {
    for (size_t k = 0; k < ws.size(); ++k) {
      if (spans[k].own_end == spans[k].own_begin) continue;
      Tensor a = amax.narrow(static_cast<int64_t>(k), 1);
      ops::fp8_amax(own_piece(k), a, compute_);
    }
    if (size_ > 1) group_->all_reduce(amax, comm::ReduceOp::Max, compute_);
    if (groups_.tp) groups_.tp->all_reduce(amax, comm::ReduceOp::Max, compute_);
    Tensor scales = Tensor::empty(amax.shape(), DType::F32, compute_);
    ops::fp8_scale_from_amax(amax, scales, type, compute_);
    for (size_t k = 0; k < ws.size(); ++k) scale[k] = scales.narrow(static_cast<int64_t>(k), 1);
  }
  // The codes' buffers (once) and their dequantization factors.
  const Tensor zero = Tensor::zeros({1, 1}, params.dtype(), compute_);
  for (size_t k = 0; k < ws.size(); ++k) {
    ops::Fp8Tensor& c = ws[k].codes;
    if (!c.data.defined()) {
      const Tensor w = store_.param_span(ws[k].first, ws[k].last);
      c.data = Tensor::empty(w.shape(), params.dtype(), compute_);
      c.rows = w.rows();
      c.cols = w.cols();
      c.type = type;
    }
    c.scale_inv = ops::fp8_quantize(zero, scale[k], type, false, nullptr, compute_).scale_inv;
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (group_size(b) == 1) continue;
    const GradBucket& bucket = buckets[b];
    const OwnedRange& r = owned_[b];
    Tensor full = params.slice_flat(bucket.begin, {bucket.end - bucket.begin});
    Tensor mine = params.slice_flat(r.begin, {r.end - r.begin});
    bool has_fp8 = false;
    for (int h : bucket.params) has_fp8 |= weight_of[static_cast<size_t>(h)] >= 0;
    if (!has_fp8) {
      group_of(b)->all_gather(mine, full, s);
      done_[b].record(s);
      param_ready_[b] = false;
      continue;
    }
    // The shard as it travels: the owned parameters, the FP8 weights' pieces as codes.
    Tensor staging = Tensor::empty({bucket.end - bucket.begin}, params.dtype(), compute_);
    Tensor out = staging.slice_flat(r.begin - bucket.begin, {r.end - r.begin});
    copy_tensor(mine, out, compute_);
    for (size_t k = 0; k < ws.size(); ++k) {
      const Span& sp = spans[k];
      if (sp.bucket != b || sp.own_end == sp.own_begin) continue;
      Tensor a = amax.narrow(static_cast<int64_t>(k), 1);
      const ops::Fp8Tensor q = ops::fp8_quantize(own_piece(k), scale[k], type, false,
                                                 st.delayed() ? &a : nullptr, compute_);
      Tensor dst = staging.slice_flat(sp.own_begin - bucket.begin, {1, sp.own_end - sp.own_begin});
      copy_tensor(q.data, dst, compute_);
    }
    group_of(b)->all_gather(out, staging, s);
    // Unpack: codes into the weights' code buffers, everything else into the parameters.
    for (int h : bucket.params) {
      const ParamDesc& d = store_.desc(h);
      Tensor src = staging.slice_flat(d.offset - bucket.begin, {d.numel()});
      const int k = weight_of[static_cast<size_t>(h)];
      Tensor dst = k >= 0 ? ws[static_cast<size_t>(k)].codes.data.slice_flat(
                                d.offset - spans[static_cast<size_t>(k)].begin, {d.numel()})
                          : params.slice_flat(d.offset, {d.numel()});
      copy_tensor(src, dst, s);
    }
    done_[b].record(s);
    param_ready_[b] = false;
  }
  st.gathered(st.delayed() ? amax : Tensor());
}

void DataParallel::params_needed(const std::vector<int>& handles) {
  if (!gather_in_flight_) return;
  for (int h : handles) {
    const auto b = static_cast<size_t>(store_.bucket_of(h));
    if (!param_ready_[b]) {
      done_[b].wait_on(compute_);
      param_ready_[b] = true;
    }
  }
}

void DataParallel::finish_param_gather() {
  if (!gather_in_flight_) return;
  const Stream& s = opt_.overlap_param_gather && overlap_ ? comm_ : compute_;
  if (group_) group_->synchronize(s);
  if (groups_.expert.dp) groups_.expert.dp->synchronize(s);
  for (size_t b = 0; b < param_ready_.size(); ++b) {
    if (!param_ready_[b]) done_[b].wait_on(compute_);
    param_ready_[b] = true;
  }
  gather_in_flight_ = false;
}

}  // namespace megadlm
