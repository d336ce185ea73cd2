#include "megadlm/parallel/data_parallel/fsdp.h"
#include <algorithm>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/data_parallel/grad_norm_runs.h"

namespace megadlm {

BufferLayout FullyShardedDataParallel::buffer_layout(ShardingStrategy strategy, int d,
                                                     const std::vector<FsdpUnit>& units,
                                                     int num_params, int expert_d) {
  MDLM_CHECK(d >= 1, "FSDP over ", d, " ranks");
  if (expert_d <= 0) expert_d = d;
  BufferLayout l;
  l.bucket_size = 0;  // buckets are the units, whatever their size
  // Every shard whole and 64-aligned (the distributed optimizer's rule, data_parallel.h).
  l.bucket_multiple = strategy == ShardingStrategy::NoShard ? 64 : 64LL * d;
  l.expert_bucket_multiple = strategy == ShardingStrategy::NoShard ? 64 : 64LL * expert_d;
  l.unit_of.assign(static_cast<size_t>(num_params), -1);
  for (size_t u = 0; u < units.size(); ++u)
    for (int h : units[u].handles) {
      MDLM_CHECK(h >= 0 && h < num_params, "FSDP unit ", u, " names parameter ", h, " of ", num_params);
      MDLM_CHECK(l.unit_of[static_cast<size_t>(h)] < 0, "parameter ", h, " is in two FSDP units");
      l.unit_of[static_cast<size_t>(h)] = static_cast<int>(u);
    }
  for (int h = 0; h < num_params; ++h)
    MDLM_CHECK(l.unit_of[static_cast<size_t>(h)] >= 0, "parameter ", h, " is in no FSDP unit");
  l.shard_params = strategy == ShardingStrategy::OptimGradsParams;
  l.shard_grads = strategy == ShardingStrategy::OptimGrads || strategy == ShardingStrategy::OptimGradsParams;
  return l;
}

FsdpShardLayout FullyShardedDataParallel::shard_layout(const ParameterStore& store,
                                                      ShardingStrategy strategy, int d,
                                                      const std::vector<FsdpUnit>& units, int expert_d) {
  MDLM_CHECK(d >= 1, "FSDP over ", d, " ranks");
  if (expert_d <= 0) expert_d = d;
  const bool sharded = strategy != ShardingStrategy::NoShard;
  std::vector<int> unit_of_handle(store.descs().size(), -1);
  for (size_t u = 0; u < units.size(); ++u)
    for (int h : units[u].handles) unit_of_handle.at(static_cast<size_t>(h)) = static_cast<int>(u);
  FsdpShardLayout l;
  l.unit_elements.assign(units.size(), 0);
  l.flat_size = store.flat_size();
  const auto& sb = store.buckets();
  for (size_t i = 0; i < sb.size(); ++i) {
    FsdpShardLayout::Bucket b;
    b.begin = sb[i].begin;
    b.end = sb[i].end;
    b.unit = unit_of_handle[static_cast<size_t>(sb[i].params.front())];
    MDLM_CHECK(b.unit >= 0, "bucket ", i, " belongs to no FSDP unit");
    for (int h : sb[i].params)
      MDLM_CHECK(unit_of_handle[static_cast<size_t>(h)] == b.unit, "bucket ", i, " spans two FSDP units");
    b.expert = sb[i].expert;
    b.ranks = b.expert ? expert_d : d;
    const int64_t len = b.end - b.begin;
    if (sharded) {
      MDLM_CHECK(len % b.ranks == 0, "bucket of ", len, " elements does not split into ", b.ranks,
                 " shards (lay the store out with FullyShardedDataParallel::buffer_layout)");
      b.shard = len / b.ranks;
      b.compact_offset = l.shard_elements;
    } else {
      b.shard = len;  // replicated optimizer state: the compact layout is the flat one
      b.compact_offset = b.begin;
    }
    l.shard_elements += b.shard;
    l.unit_elements[static_cast<size_t>(b.unit)] += len;
    l.buckets.push_back(b);
  }
  return l;
}

OwnedRange FsdpShardLayout::owned(size_t b, int rank) const {
  const Bucket& k = buckets.at(b);
  if (k.shard == k.end - k.begin) return {k.begin, k.end, k.compact_offset};
  MDLM_CHECK(rank >= 0 && rank < k.ranks, "rank ", rank, " of a bucket cut over ", k.ranks, " ranks");
  return {k.begin + rank * k.shard, k.begin + (rank + 1) * k.shard, k.compact_offset};
}

int64_t FsdpShardLayout::largest_unit() const {
  int64_t most = 0;
  for (int64_t n : unit_elements) most = std::max(most, n);
  return most;
}

FullyShardedDataParallel::FullyShardedDataParallel(ParameterStore& store, std::vector<FsdpUnit> units,
                                                   std::shared_ptr<comm::Communicator> group,
                                                   FsdpOptions options, const Stream& compute,
                                                   DataParallelGroups groups)
    : store_(store), units_(std::move(units)), group_(std::move(group)),
      groups_(groups.without_single_ranks()), opt_(options), compute_(compute) {
  MDLM_CHECK(store.materialized(), "FSDP needs a materialised parameter store");
  MDLM_CHECK(!groups_.inter, "FSDP has no distributed-optimizer instances: its groups name an "
             "inter-instance group of ", groups.inter ? groups.inter->size() : 0, " ranks");
  size_ = group_ ? group_->size() : 1;
  rank_ = group_ ? group_->rank() : 0;
  const ShardingStrategy st = opt_.strategy;
  MDLM_CHECK(store.params_sharded() == (st == ShardingStrategy::OptimGradsParams) &&
                 store.grads_sharded() == (st == ShardingStrategy::OptimGrads ||
                                           st == ShardingStrategy::OptimGradsParams),
             "the parameter store was not laid out for FSDP ", sharding_strategy_name(st),
             " (materialise it with FullyShardedDataParallel::buffer_layout)");
  const int expert_size = groups_.expert.dp ? groups_.expert.dp->size() : 1;
  overlap_ = opt_.overlap && compute.is_cuda() &&
             (size_ > 1 || expert_size > 1 || opt_.streams_with_one_rank);
  ag_stream_ = overlap_ ? Stream::create(compute.device()) : compute;
  rs_stream_ = overlap_ ? Stream::create(compute.device()) : compute;
  // Gathers and reductions on separate NCCL communicators: one communicator launches its
  // operations in host order, so a prefetch would queue behind a reduce-scatter.
  ag_group_ = overlap_ && size_ > 1
                  ? std::shared_ptr<comm::Communicator>(group_->split(0, rank_, group_->name() + "-ag"))
                  : group_;
  const std::shared_ptr<comm::Communicator>& expert_dp = groups_.expert.dp;
  expert_ag_group_ = overlap_ && expert_size > 1
                         ? std::shared_ptr<comm::Communicator>(
                               expert_dp->split(0, expert_dp->rank(), expert_dp->name() + "-ag"))
                         : expert_dp;

  // Buckets, their units and this rank's shard of each (the planner's computation).
  const FsdpShardLayout layout = shard_layout(store, st, size_, units_, expert_size);
  unit_buckets_.assign(units_.size(), {});
  for (size_t i = 0; i < layout.buckets.size(); ++i) {
    const FsdpShardLayout::Bucket& lb = layout.buckets[i];
    Bucket b;
    b.begin = lb.begin;
    b.end = lb.end;
    b.unit = lb.unit;
    for (int h : store.buckets()[i].params) b.shared |= store.desc(h).pipeline_share != PipelineShare::None;
    b.expert = lb.expert;
    b.group = b.expert ? groups_.expert.dp.get() : group_.get();
    b.ag_group = b.expert ? expert_ag_group_.get() : ag_group_.get();
    b.size = lb.ranks;
    b.rank = b.group ? b.group->rank() : 0;
    b.gathered = Event::create(compute.device());
    b.reduce_done = Event::create(compute.device());
    b.param_ready = Event::create(compute.device());
    unit_buckets_[static_cast<size_t>(b.unit)].push_back(static_cast<int>(i));
    owned_.push_back(layout.owned(i, b.rank));
    buckets_.push_back(std::move(b));
  }
  const int64_t compact = layout.shard_elements;
  if (store.params_sharded()) {
    param_shards_ = Tensor::zeros({std::max<int64_t>(compact, 1)}, store.param_dtype(), compute).slice_flat(0, {compact});
    // Shard-only initialisation by global element index (= --init-model-with-meta-device):
    // no rank ever materialises the full weights.
    for (const OwnedRange& r : owned_) {
      Tensor mine = param_shards_.slice_flat(r.compact_offset, {r.end - r.begin});
      store.fill_initial_values(mine, r.begin, compute);
    }
  }
  if (store.grads_sharded())
    grad_shards_ = Tensor::zeros({std::max<int64_t>(compact, 1)}, store.grad_dtype(), compute).slice_flat(0, {compact});
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  // Buffers of unfinished reductions must not return to the pool before the reductions end.
  try {
    while (!in_flight_.empty()) retire_oldest();
  } catch (...) {
  }
}

FsdpBytes FullyShardedDataParallel::persistent_bytes() const {
  FsdpBytes b;
  b.params = static_cast<int64_t>(store_.params_sharded() ? param_shards_.nbytes() : store_.flat_params().nbytes());
  b.grads = static_cast<int64_t>(store_.grads_sharded() ? grad_shards_.nbytes() : store_.flat_grads().nbytes());
  return b;
}

std::string FullyShardedDataParallel::summary() const {
  bool experts = false;
  for (const Bucket& b : buckets_) experts |= b.expert;
  const int expert_d = groups_.expert.dp ? groups_.expert.dp->size() : 1;
  return std::string(", Megatron-FSDP ") + sharding_strategy_name(opt_.strategy) + " over " +
         std::to_string(size_) + " rank(s)" +
         (experts ? " (experts over " + std::to_string(expert_d) + ")" : "") + ", " +
         std::to_string(units_.size()) + " unit(s)";
}

bool FullyShardedDataParallel::checkpoint_writer() const {
  // Sharded strategies: every rank owns a disjoint shard. no_shard: replicas; rank 0 writes.
  return sharded() || rank_ == 0;
}

Tensor FullyShardedDataParallel::optimizer_grads() const {
  return store_.grads_sharded() ? grad_shards_ : store_.flat_grads();
}

std::vector<int> FullyShardedDataParallel::buckets_of(const std::vector<int>& handles) const {
  std::vector<int> out;
  for (int h : handles) {
    const int b = store_.bucket_of(h);
    if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  }
  return out;
}

int FullyShardedDataParallel::unit_of(const std::vector<int>& handles) const {
  MDLM_CHECK(!handles.empty(), "a ParamHooks call with no parameters");
  return buckets_[static_cast<size_t>(store_.bucket_of(handles.front()))].unit;
}

void FullyShardedDataParallel::record(FsdpAction::Kind kind, int unit, int bucket) {
  if (opt_.trace) trace_.push_back({kind, unit, bucket});
}

int FullyShardedDataParallel::gathered_units() const {
  int n = 0;
  for (const auto& ub : unit_buckets_)
    n += std::any_of(ub.begin(), ub.end(), [&](int b) { return buckets_[static_cast<size_t>(b)].window.defined(); });
  return n;
}

int FullyShardedDataParallel::grad_slot_units() const {
  std::vector<bool> live(units_.size(), false);
  for (const Bucket& b : buckets_)
    if (b.grad_slot.defined()) live[static_cast<size_t>(b.unit)] = true;
  for (const InFlight& f : in_flight_) live[static_cast<size_t>(f.unit)] = true;
  return static_cast<int>(std::count(live.begin(), live.end(), true));
}

// ------------------------------------------------------------------ weights (optim_grads_params)

void FullyShardedDataParallel::gather(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (b.window.defined()) return;
  const int64_t len = b.end - b.begin;
  // From the compute stream's pool: freed there, after the compute that reads it.
  b.window = Tensor::empty({len}, store_.param_dtype(), compute_);
  const OwnedRange& r = owned_[static_cast<size_t>(bi)];
  Tensor mine = param_shards_.slice_flat(r.compact_offset, {r.end - r.begin});
  if (overlap_) {
    Event allocated = Event::create(compute_.device());
    allocated.record(compute_);  // the window (and the optimizer's last write of the shard)
    allocated.wait_on(ag_stream_);
    if (b.size > 1) b.ag_group->all_gather(mine, b.window, ag_stream_);
    else copy_tensor(mine, b.window, ag_stream_);
    b.gathered.record(ag_stream_);
    b.waited = false;
  } else {
    if (b.size > 1) b.group->all_gather(mine, b.window, compute_);
    else copy_tensor(mine, b.window, compute_);
    b.waited = true;
  }
  store_.bind_params(bi, b.window);
  ++stats_.all_gathers;
  record(FsdpAction::Kind::Gather, b.unit, bi);
  stats_.max_gathered_units = std::max(stats_.max_gathered_units, gathered_units());
}

void FullyShardedDataParallel::wait_gathered(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (b.waited) return;
  b.gathered.wait_on(compute_);
  b.waited = true;
}

void FullyShardedDataParallel::release(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (!store_.params_sharded() || b.users > 0 || !b.window.defined()) return;
  store_.unbind_params(bi);
  b.window = Tensor();  // back to the compute stream's pool, after what it queued so far
  record(FsdpAction::Kind::Release, b.unit, bi);
}

void FullyShardedDataParallel::prefetch(int u) {
  if (!store_.params_sharded() || u < 0 || u >= static_cast<int>(units_.size())) return;
  bool needed = false;
  for (int b : unit_buckets_[static_cast<size_t>(u)]) needed |= !buckets_[static_cast<size_t>(b)].window.defined();
  if (!needed || gathered_units() >= 2) return;  // two units in flight at most
  for (int b : unit_buckets_[static_cast<size_t>(u)]) gather(b);
}

void FullyShardedDataParallel::params_needed(const std::vector<int>& handles) {
  const int u = unit_of(handles);
  record(FsdpAction::Kind::Needed, u);
  const std::vector<int> bs = buckets_of(handles);
  if (!store_.params_sharded()) {
    for (int b : bs) wait_param_gather(b);
    return;
  }
  for (int b : bs) {
    ++buckets_[static_cast<size_t>(b)].users;
    gather(b);
  }
  // The next unit of this chunk's forward, issued before this one is released so that its
  // gather overlaps this unit's compute.
  const int next = u + 1;
  if (next < static_cast<int>(units_.size()) && units_[static_cast<size_t>(next)].chunk == units_[static_cast<size_t>(u)].chunk)
    prefetch(next);
  for (int b : bs) wait_gathered(b);
}

void FullyShardedDataParallel::params_done(const std::vector<int>& handles) {
  record(FsdpAction::Kind::Done, unit_of(handles));
  if (!store_.params_sharded()) return;
  for (int b : buckets_of(handles)) {
    --buckets_[static_cast<size_t>(b)].users;
    release(b);
  }
}

// ----------------------------------------------------------------------------------- gradients

void FullyShardedDataParallel::retire_oldest() {
  InFlight& f = in_flight_.front();
  f.done.wait_on(compute_);  // the slot may be reused only after its reduce-scatter read it
  in_flight_.pop_front();
}

void FullyShardedDataParallel::acquire_grad_slot(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (b.grad_slot.defined()) return;
  while (!in_flight_.empty() && grad_slot_units() >= 2) retire_oldest();
  // Weight gradients are ADDED by the model: the slot starts at zero.
  b.grad_slot = Tensor::zeros({b.end - b.begin}, store_.grad_dtype(), compute_);
  store_.bind_grads(bi, b.grad_slot);
  record(FsdpAction::Kind::GradSlot, b.unit, bi);
  stats_.max_grad_slot_units = std::max(stats_.max_grad_slot_units, grad_slot_units());
}

void FullyShardedDataParallel::reduce_scatter_slot(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  InFlight f;
  f.unit = b.unit;
  f.slot = std::move(b.grad_slot);
  b.grad_slot = Tensor();
  store_.unbind_grads(bi);
  const OwnedRange& r = owned_[static_cast<size_t>(bi)];
  Tensor shard = grad_shards_.slice_flat(r.compact_offset, {r.end - r.begin});
  const Stream& s = rs_stream_;
  // The scratch comes from the compute stream's pool (freed there once the reduction is done);
  // allocated before the event so that the reduction stream sees it allocated.
  if (b.size > 1) f.scratch = Tensor::empty({r.end - r.begin}, store_.grad_dtype(), compute_);
  if (overlap_) {
    Event produced = Event::create(compute_.device());
    produced.record(compute_);
    produced.wait_on(s);
  }
  // This micro-batch's contribution, summed over the group, ADDED into the shard: the
  // accumulated shard is never rescaled (#3023), and with one rank the slot is added once, not
  // twice (#6660).
  if (b.size > 1) {
    b.group->reduce_scatter(f.slot, f.scratch, comm::ReduceOp::Sum, s);
    ops::add(shard, f.scratch, shard, s);
  } else {
    ops::add(shard, f.slot, shard, s);
  }
  f.done = Event::create(compute_.device());
  f.done.record(s);
  ++stats_.reduce_scatters;
  record(FsdpAction::Kind::ReduceScatter, b.unit, bi);
  in_flight_.push_back(std::move(f));
  if (!overlap_) in_flight_.pop_front();  // done already: the buffers go now
}

void FullyShardedDataParallel::backward_needed(const std::vector<int>& handles) {
  const int u = unit_of(handles);
  record(FsdpAction::Kind::BackwardNeeded, u);
  const std::vector<int> bs = buckets_of(handles);
  if (!store_.params_sharded() && !store_.grads_sharded()) {
    for (int b : bs) wait_param_gather(b);
    return;
  }
  for (int b : bs) {
    Bucket& bucket = buckets_[static_cast<size_t>(b)];
    if (store_.params_sharded()) {
      ++bucket.users;
      gather(b);
    } else {
      wait_param_gather(b);
    }
    if (store_.grads_sharded()) {
      ++bucket.grad_users;
      acquire_grad_slot(b);
    }
  }
  // The unit before this one in the chunk's forward is the next one backward needs.
  const int prev = u - 1;
  if (prev >= 0 && units_[static_cast<size_t>(prev)].chunk == units_[static_cast<size_t>(u)].chunk) prefetch(prev);
  if (store_.params_sharded())
    for (int b : bs) wait_gathered(b);
}

void FullyShardedDataParallel::backward_done(const std::vector<int>& handles) {
  record(FsdpAction::Kind::BackwardDone, unit_of(handles));
  for (int b : buckets_of(handles)) {
    Bucket& bucket = buckets_[static_cast<size_t>(b)];
    // A unit's contribution is reduce-scattered as soon as its last reader is done with it; a
    // tied weight read by the head and the embedding is reduce-scattered after each (sums
    // commute), so its full gradient never waits through the layers in between.
    if (store_.grads_sharded() && --bucket.grad_users == 0) reduce_scatter_slot(b);
    if (store_.params_sharded()) {
      --bucket.users;
      release(b);
    }
  }
}

void FullyShardedDataParallel::grads_ready(const std::vector<int>& handles) {
  // no_shard / optim: the full buffer accumulates over the micro-batches; each bucket is reduced
  // once, on the last one, as soon as all its gradients are final (Megatron's no_sync).
  if (store_.grads_sharded() || !last_micro_batch_) return;
  for (int h : handles) {
    const int b = store_.bucket_of(h);
    if (--buckets_[static_cast<size_t>(b)].pending == 0) launch_reduce(b);
  }
}

void FullyShardedDataParallel::launch_reduce(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  MDLM_CHECK(!b.reduced, "FSDP bucket ", bi, " reduced twice in one step");
  b.reduced = true;
  if (b.size == 1) return;
  Tensor full = store_.flat_grads().slice_flat(b.begin, {b.end - b.begin});
  const Stream& s = rs_stream_;
  if (overlap_) {
    Event produced = Event::create(compute_.device());
    produced.record(compute_);
    produced.wait_on(s);
  }
  if (opt_.strategy == ShardingStrategy::NoShard) {
    b.group->all_reduce(full, comm::ReduceOp::Sum, s);
    ++stats_.all_reduces;
  } else {
    // optim: in place, into this rank's slice of the same buffer (no second gradient buffer).
    const OwnedRange& r = owned_[static_cast<size_t>(bi)];
    Tensor mine = store_.flat_grads().slice_flat(r.begin, {r.end - r.begin});
    b.group->reduce_scatter(full, mine, comm::ReduceOp::Sum, s);
    ++stats_.reduce_scatters;
  }
  b.reduce_done.record(s);
  record(FsdpAction::Kind::Reduce, b.unit, bi);
}

void FullyShardedDataParallel::start_step() {
  last_micro_batch_ = false;
  const auto& sb = store_.buckets();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    buckets_[i].pending = static_cast<int>(sb[i].params.size());
    buckets_[i].reduced = false;
  }
  if (grad_shards_.defined()) ops::fill(grad_shards_, 0.0f, compute_);
}

template <typename Fn>
void FullyShardedDataParallel::for_each_owned_piece(Fn&& fn) const {
  const bool flat = optimizer_grads_flat();
  for (const OwnedRange& r : owned_) {
    for (const ParamDesc& d : store_.descs()) {
      const int64_t b = std::max(r.begin, d.offset), e = std::min(r.end, d.offset + d.numel());
      if (b < e) fn(d, flat ? b : r.compact_offset + (b - r.begin), e - b);
    }
  }
}

void FullyShardedDataParallel::finish_grad_sync() {
  finish_param_gather();
  if (!store_.grads_sharded())
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!buckets_[b].reduced) launch_reduce(static_cast<int>(b));
  while (!in_flight_.empty()) retire_oldest();
  if (overlap_) {
    if (group_) group_->synchronize(rs_stream_);  // the timeout names a hung reduction
    if (groups_.expert.dp) groups_.expert.dp->synchronize(rs_stream_);
    for (const Bucket& b : buckets_) b.reduce_done.wait_on(compute_);
  }
  // Every unit is resharded at the end of backward (a leftover is a hook the model missed).
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    MDLM_CHECK(b.users == 0 && b.grad_users == 0 && !b.window.defined() && !b.grad_slot.defined(),
               "FSDP unit ", b.unit, " (bucket ", i, ") is still held at the end of backward (",
               b.users, " reader(s), ", b.grad_users, " gradient writer(s))");
  }
  Tensor g = optimizer_grads();
  // A tied weight's two copies (first and last stage) sum their reduced shards over the
  // embedding group: their buckets are laid out alike, so the shards line up (#844).
  if (groups_.embedding) {
    for_each_owned_piece([&](const ParamDesc& d, int64_t off, int64_t count) {
      if (d.pipeline_share == PipelineShare::None) return;
      Tensor piece = g.slice_flat(off, {count});
      groups_.embedding->all_reduce(piece, comm::ReduceOp::Sum, compute_);
    });
  }
  // Partial gradients of replicated parameters (SP norms, QK-norms) sum over TP, on the shards:
  // every TP rank has the same bucket layout.
  if (groups_.tp) {
    for_each_owned_piece([&](const ParamDesc& d, int64_t off, int64_t count) {
      if (!d.tp.partial_grad) return;
      Tensor piece = g.slice_flat(off, {count});
      groups_.tp->all_reduce(piece, comm::ReduceOp::Sum, compute_);
    });
  }
}

double FullyShardedDataParallel::grad_sq_norm() {
  Tensor g = optimizer_grads();
  bool has_experts = false;
  for (const Bucket& b : buckets_) has_experts |= b.expert;
  // A tied weight's last-stage copy is not counted. One sum_squares per run of touching pieces
  // with the same accumulator (grad_norm_runs.h): padding between parameters is a gap, so it
  // stays unvisited.
  std::vector<NormPiece> pieces;
  for_each_owned_piece([&](const ParamDesc& d, int64_t off, int64_t count) {
    if (d.pipeline_share == PipelineShare::Copy) return;
    const int target =
        norm_target(d, {.tp = groups_.tp != nullptr, .expert_tp = groups_.expert.tp != nullptr});
    pieces.push_back({.offset = off, .count = count, .target = target});
  });
  // Sharded strategies: the shards of the group are disjoint; no_shard: replicas.
  return groups_.global_sq_norm(sum_norm_pieces(g, std::move(pieces), compute_),
                                sharded() && size_ > 1 ? group_.get() : nullptr,
                                sharded() ? groups_.expert.dp.get() : nullptr, has_experts, compute_);
}

// ---------------------------------------------------- optim / optim_grads: weights after the step

void FullyShardedDataParallel::start_param_gather() {
  if (store_.params_sharded() || !sharded()) return;
  bool any = false;  // does another rank own anything?
  for (const Bucket& b : buckets_) any |= b.size > 1;
  if (!any) return;
  const Stream& s = overlap_ ? ag_stream_ : compute_;
  if (overlap_) {
    Event stepped = Event::create(compute_.device());
    stepped.record(compute_);
    stepped.wait_on(s);
  }
  Tensor params = store_.flat_params();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (b.size == 1) continue;  // this rank owns the whole bucket
    const OwnedRange& r = owned_[i];
    Tensor full = params.slice_flat(b.begin, {b.end - b.begin});
    Tensor mine = params.slice_flat(r.begin, {r.end - r.begin});
    b.ag_group->all_gather(mine, full, s);
    b.param_ready.record(s);
    b.param_stale = overlap_;
    ++stats_.all_gathers;
    record(FsdpAction::Kind::ParamGather, b.unit, static_cast<int>(i));
  }
  gather_in_flight_ = overlap_;
}

void FullyShardedDataParallel::wait_param_gather(int bi) {
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  if (!b.param_stale) return;
  b.param_ready.wait_on(compute_);
  b.param_stale = false;
}

void FullyShardedDataParallel::finish_param_gather() {
  if (!gather_in_flight_) return;
  if (ag_group_) ag_group_->synchronize(ag_stream_);
  if (expert_ag_group_) expert_ag_group_->synchronize(ag_stream_);
  for (size_t b = 0; b < buckets_.size(); ++b) wait_param_gather(static_cast<int>(b));
  gather_in_flight_ = false;
}

}  // namespace megadlm
