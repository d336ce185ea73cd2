#include "megadlm/parallel/data_parallel/data_parallel.h"
#include <algorithm>
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
