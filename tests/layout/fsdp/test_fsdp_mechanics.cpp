// FSDP's mechanics, as an SPMD program under mpirun (np 2, 4 and, for the byte accounting and
// the accumulation, 8): accumulation, bytes and schedule, each at d = 1 (no group) and
// d = world.
//   * Accumulation: the model's gradient writes are replaced by small integers
//     (rank + 1 + micro-batch), so any summation order gives the same float: after M
//     micro-batches every owned gradient element equals the exact sum, bit for bit, for every
//     strategy. A shard rescaled at each micro-batch (#3023) or a slot added twice with one rank
//     (#6660) fails it.
//     The gradient norm from the shards with the padding poisoned with NaN is the exact sum of
//     squares.
//   * Bytes: what a rank allocates for weights, gradients and optimizer state equals the
//     per-element cost of the strategy (CPU profile: weights 4, gradients 4, masters 0 — they
//     are the fp32 weights —, Adam moments 8) times the padded buffer size, exactly, where the
//     padding is recomputed here from the parameter shapes: fused groups start at multiples of
//     64 elements and each unit's bucket ends at a multiple of 64·d (64 for no_shard). The
//     memory planner's dry computation (training/memory_plan.h) gives the same bytes; with it
//     tests/unit/training/test_memory_plan.cpp checks the CUDA profile for d = 1, 2, 4, 8. With
//     MoE layers over EP 2 the expert buckets shard over expert-dp, and the planner's shard
//     sizes are still the allocation's.
//   * Schedule: the wrapper's action trace over M micro-batches of the tiny model:
//     optim_grads_params gathers every unit twice per micro-batch (forward and backward, also
//     with recomputation), issues the next unit's gather before releasing the current one, holds
//     at most two gathered units and two gradient slots; reduce-scatters once per unit and
//     micro-batch (optim_grads*) or reduces each bucket once (no_shard, optim); ends with every
//     unit released; and every rank of the group issues the same collectives in the same order
//     (for FSDP's own collectives).
#include <gtest/gtest.h>
#include <cmath>
#include <map>
#include <numeric>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/parallel/data_parallel/fsdp.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/memory_plan.h"
#include "megadlm/training/parallelize.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

comm::DistributedRuntime& runtime() { return test::spmd::mpi_runtime(); }

constexpr ShardingStrategy kStrategies[] = {ShardingStrategy::NoShard, ShardingStrategy::Optim,
                                            ShardingStrategy::OptimGrads,
                                            ShardingStrategy::OptimGradsParams};

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// The groups to test over: no group (d = 1) and the world (d = world).
std::vector<std::shared_ptr<comm::Communicator>> groups_to_test() {
  std::vector<std::shared_ptr<comm::Communicator>> out{nullptr};
  if (runtime().world().size() > 1) out.push_back(runtime().world_shared());
  return out;
}

// ---------------------------------------------------------------------------- accumulation

// Two units: [a (3 x 40), b (70)] and [c (5 x 30)], sizes that leave padding in every bucket.
struct TwoUnits {
  ParameterStore store;
  std::vector<FsdpUnit> units;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  TwoUnits(ShardingStrategy s, std::shared_ptr<comm::Communicator> group) {
    const ParamInit init{InitKind::Normal, 0.02f};
    const int a = store.add("unit0.a", {3, 40}, {.init = init});
    const int b = store.add("unit0.b", {70}, {.init = init, .weight_decay = false});
    const int c = store.add("unit1.c", {5, 30}, {.init = init});
    units = {{0, {a, b}}, {0, {c}}};
    const int d = group ? group->size() : 1;
    store.materialize(DType::F32, 5, Stream::cpu(), FullyShardedDataParallel::buffer_layout(s, d, units, 3));
    fsdp = std::make_unique<FullyShardedDataParallel>(store, units, group, FsdpOptions{.strategy = s},
                                                      Stream::cpu());
  }
};

TEST(FsdpAccumulation, OwnedGradientsAreTheExactSumOverRanksAndMicroBatches) {
  const int rank = runtime().world().rank();
  for (const auto& group : groups_to_test()) {
    const int d = group ? group->size() : 1;
    const int r = group ? group->rank() : 0;
    for (ShardingStrategy s : kStrategies) {
      for (int M : {1, 3}) {
        SCOPED_TRACE(std::string(sharding_strategy_name(s)) + ", d " + std::to_string(d) + ", M " +
                     std::to_string(M) + ", rank " + std::to_string(rank));
        TwoUnits t(s, group);
        FullyShardedDataParallel& f = *t.fsdp;
        t.store.zero_grads(Stream::cpu());
        f.start_step();
        for (int m = 0; m < M; ++m) {
          f.set_last_micro_batch(m == M - 1);
          for (int u = 1; u >= 0; --u) {  // backward order
            const std::vector<int>& h = t.units[static_cast<size_t>(u)].handles;
            f.backward_needed(h);
            for (int p : h) {  // the model ADDS its contribution
              Tensor g = t.store.grad(p);
              for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] += static_cast<float>(r + 1 + m);
            }
            f.grads_ready(h);
            f.backward_done(h);
          }
        }
        f.finish_grad_sync();
        // Σ_ranks Σ_m (rank + 1 + m): small integers, exact in fp32 in any order.
        const float want = static_cast<float>(M * d * (d + 1) / 2 + d * M * (M - 1) / 2);
        Tensor g = f.optimizer_grads();
        int64_t checked = 0;
        for (const OwnedRange& o : f.owned_ranges()) {
          for (int64_t e = o.begin; e < o.end; ++e) {
            const int64_t at = f.optimizer_grads_flat() ? e : o.compact_offset + (e - o.begin);
            bool real = false;
            for (const ParamDesc& p : t.store.descs()) real |= e >= p.offset && e < p.offset + p.numel();
            const float v = g.data<float>()[at];
            ASSERT_EQ(v, real ? want : 0.0f) << "flat element " << e << (real ? "" : " (padding)");
            checked += real;
          }
        }
        // Every real element is owned by exactly one rank (by all under no_shard).
        double total = static_cast<double>(checked);
        if (group && s != ShardingStrategy::NoShard) {
          Tensor c = Tensor::from_floats({static_cast<float>(checked)}, {1});
          group->all_reduce(c, comm::ReduceOp::Sum, Stream::cpu());
          total = c.data<float>()[0];
        }
        EXPECT_EQ(total, 120 + 70 + 150);
        // The norm comes from the owned shards (summed over the group where they are
        // disjoint) and never visits padding: poisoned with NaN, the norm stays the exact sum.
        for (const OwnedRange& o : f.owned_ranges())
          for (int64_t e = o.begin; e < o.end; ++e) {
            bool real = false;
            for (const ParamDesc& p : t.store.descs()) real |= e >= p.offset && e < p.offset + p.numel();
            if (!real) g.data<float>()[f.optimizer_grads_flat() ? e : o.compact_offset + (e - o.begin)] = NAN;
          }
        EXPECT_EQ(f.grad_sq_norm(), 340.0 * want * want);
      }
    }
  }
}

// ------------------------------------------------------------------------------------- bytes

RunConfig fsdp_run(ShardingStrategy s, int d) {
  RunConfig r = test::tiny_run({}, 1);
  r.parallel.world_size = d;
  r.parallel.data_parallel_size = d;
  r.parallel.use_custom_fsdp = true;
  r.parallel.data_parallel_sharding_strategy = s;
  r.parallel.use_distributed_optimizer = s != ShardingStrategy::NoShard;
  return r;
}

TEST(FsdpBytes, PersistentBytesAreTheStrategysCostTimesThePaddedBuffer) {
  for (const auto& group : groups_to_test()) {
    const int d = group ? group->size() : 1;
    for (ShardingStrategy s : kStrategies) {
      SCOPED_TRACE(std::string(sharding_strategy_name(s)) + ", d " + std::to_string(d));
      const RunConfig cfg = fsdp_run(s, d);
      std::unique_ptr<parallel::ProcessGroups> pg;
      if (group) pg = std::make_unique<parallel::ProcessGroups>(parallel::ProcessGroups::build(group, cfg.parallel));
      std::unique_ptr<ParallelModel> pm = parallelize(cfg, pg.get());
      ASSERT_NE(pm->fsdp, nullptr);
      // The padded size S, from the shapes: per unit, fused groups 64-aligned, the bucket
      // rounded up to 64·d (sharded) or 64 (no_shard).
      const int64_t mult = s == ShardingStrategy::NoShard ? 64 : 64LL * d;
      const auto& descs = pm->store.descs();
      int64_t S = 0, psi = 0;
      for (const FsdpUnit& u : pm->fsdp->units()) {
        int64_t len = 0;
        for (size_t i = 0; i < u.handles.size();) {
          int64_t group_numel = descs[static_cast<size_t>(u.handles[i])].numel();
          size_t j = i + 1;
          while (j < u.handles.size() && descs[static_cast<size_t>(u.handles[j])].fuse_with_previous)
            group_numel += descs[static_cast<size_t>(u.handles[j++])].numel();
          len += align_up(group_numel, 64);
          i = j;
        }
        S += align_up(len, mult);
      }
      for (const ParamDesc& p : descs) psi += p.numel();
      ASSERT_GE(S, psi);
      const FsdpBytes b = pm->fsdp->persistent_bytes();
      const bool wsh = s == ShardingStrategy::OptimGradsParams;
      const bool gsh = wsh || s == ShardingStrategy::OptimGrads;
      const bool osh = s != ShardingStrategy::NoShard;
      EXPECT_EQ(b.params, 4 * (wsh ? S / d : S));
      EXPECT_EQ(b.grads, 4 * (gsh ? S / d : S));
      EXPECT_TRUE(pm->optimizer->masters_alias_weights());
      EXPECT_EQ(pm->optimizer->state_bytes(), 8 * (osh ? S / d : S));
      // The headline numbers (CPU profile: 16, 8 + 8/d, 4 + 12/d, 16/d bytes/element).
      const double per_element = static_cast<double>(b.params + b.grads + pm->optimizer->state_bytes()) / S;
      const double headline = s == ShardingStrategy::NoShard      ? 16.0
                              : s == ShardingStrategy::Optim      ? 8.0 + 8.0 / d
                              : s == ShardingStrategy::OptimGrads ? 4.0 + 12.0 / d
                                                                  : 16.0 / d;
      EXPECT_DOUBLE_EQ(per_element, headline);
      // The memory planner's dry computation (CPU profile) is exactly this allocation.
      const StageMemory plan = plan_memory(cfg, PlanDevice::Cpu).stages.at(0);
      EXPECT_EQ(plan.weights, b.params);
      EXPECT_EQ(plan.grads, b.grads);
      EXPECT_EQ(plan.masters + plan.moments, pm->optimizer->state_bytes());
    }
  }
}

TEST(FsdpBytes, ThePlannersDdpAndDistributedOptimizerBytesAreTheAllocationToo) {
  for (const auto& group : groups_to_test()) {
    const int d = group ? group->size() : 1;
    for (bool dist_opt : {false, true}) {
      SCOPED_TRACE(std::string(dist_opt ? "distributed optimizer" : "DDP") + ", d " + std::to_string(d));
      RunConfig cfg = test::tiny_run({}, 1);
      cfg.parallel.world_size = cfg.parallel.data_parallel_size = d;
      cfg.parallel.use_distributed_optimizer = dist_opt;
      cfg.parallel.overlap_grad_reduce = true;
      cfg.parallel.ddp_bucket_size = 20000;  // several buckets, each padded under dist-opt
      std::unique_ptr<parallel::ProcessGroups> pg;
      if (group) pg = std::make_unique<parallel::ProcessGroups>(parallel::ProcessGroups::build(group, cfg.parallel));
      std::unique_ptr<ParallelModel> pm = parallelize(cfg, pg.get());
      const StageMemory plan = plan_memory(cfg, PlanDevice::Cpu).stages.at(0);
      EXPECT_EQ(plan.weights, static_cast<int64_t>(pm->store.flat_params().nbytes()));
      const int64_t grads = static_cast<int64_t>(pm->store.flat_grads().nbytes()) +
                            (dist_opt ? static_cast<int64_t>(pm->data_parallel->optimizer_grads().nbytes()) : 0);
      EXPECT_EQ(plan.grads, grads);
      EXPECT_EQ(plan.masters + plan.moments, pm->optimizer->state_bytes());
    }
  }
}

// Experts shard over their own group (expert-dp = world / 2 with EP 2), dense buckets over the
// world: the planner's shard sizes (from the configuration's sizes) are the wrapper's (from its
// groups), bucket by bucket through the allocation. The expected shard of every bucket is
// recomputed here from its kind: len / world (dense) or len / (world / 2) (expert), whole under
// no_shard.
TEST(FsdpBytes, ThePlannersExpertAndDenseShardsAreTheWrappers) {
  const int world = runtime().world().size();
  if (world < 2) GTEST_SKIP() << "needs 2 ranks or more: experts over EP 2";
  const int ed = world / 2;
  for (ShardingStrategy s : kStrategies) {
    SCOPED_TRACE(std::string(sharding_strategy_name(s)) + ", d " + std::to_string(world));
    RunConfig cfg = fsdp_run(s, world);
    test::make_moe(cfg, 4, 2);
    cfg.parallel.expert_model_parallel_size = 2;
    cfg.parallel.expert_tensor_parallel_size = 1;
    cfg.parallel.expert_data_parallel_size = ed;
    const parallel::ProcessGroups pg = parallel::ProcessGroups::build(runtime().world_shared(), cfg.parallel);
    std::unique_ptr<ParallelModel> pm = parallelize(cfg, &pg);
    ASSERT_NE(pm->fsdp, nullptr);
    const bool sharded = s != ShardingStrategy::NoShard;
    const auto& buckets = pm->store.buckets();
    const auto& owned = pm->fsdp->owned_ranges();
    ASSERT_EQ(owned.size(), buckets.size());
    int64_t S = 0, kept = 0, experts = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const int64_t len = buckets[i].end - buckets[i].begin;
      const int ranks = buckets[i].expert ? ed : world;
      experts += buckets[i].expert;
      const int64_t shard = sharded ? len / ranks : len;
      if (sharded) {
        EXPECT_EQ(len % (64 * ranks), 0) << "bucket " << i;
      }
      EXPECT_EQ(owned[i].end - owned[i].begin, shard) << "bucket " << i;
      S += len;
      kept += shard;
    }
    EXPECT_GT(experts, 0);
    EXPECT_EQ(S, pm->store.flat_size());
    const bool wsh = s == ShardingStrategy::OptimGradsParams;
    const bool gsh = wsh || s == ShardingStrategy::OptimGrads;
    const FsdpBytes b = pm->fsdp->persistent_bytes();
    EXPECT_EQ(b.params, 4 * (wsh ? kept : S));
    EXPECT_EQ(b.grads, 4 * (gsh ? kept : S));
    EXPECT_EQ(pm->optimizer->state_bytes(), 8 * kept);
    const StageMemory plan = plan_memory(cfg, PlanDevice::Cpu).stages.at(0);
    EXPECT_EQ(plan.weights, b.params);
    EXPECT_EQ(plan.grads, b.grads);
    EXPECT_EQ(plan.masters + plan.moments, pm->optimizer->state_bytes());
  }
}

// ---------------------------------------------------------------------------------- schedule

struct ScheduleRun {
  std::vector<FsdpAction> trace;
  FsdpStats stats;
  int units = 0, buckets = 0;
};

ScheduleRun run_schedule(ShardingStrategy s, std::shared_ptr<comm::Communicator> group, int M,
                         bool recompute) {
  RunConfig cfg = test::tiny_run({}, 1);
  if (recompute) {
    cfg.model.recompute_granularity = RecomputeGranularity::Full;
    cfg.model.recompute_num_layers = 1;
  }
  ParameterStore store;
  GptModel model(cfg.model, store);
  std::vector<FsdpUnit> units;
  for (std::vector<int>& h : model.param_units()) units.push_back({0, std::move(h)});
  const int d = group ? group->size() : 1;
  store.materialize(DType::F32, 3, Stream::cpu(),
                    FullyShardedDataParallel::buffer_layout(s, d, units, static_cast<int>(store.descs().size())));
  FullyShardedDataParallel f(store, units, group, {.strategy = s, .trace = true}, Stream::cpu());
  ModelRuntime rt;
  rt.stream = Stream::cpu();
  rt.hooks = &f;
  const int r = group ? group->rank() : 0;
  store.zero_grads(rt.stream);
  f.start_step();
  for (int m = 0; m < M; ++m) {
    std::vector<std::vector<int32_t>> samples;
    for (int b = 0; b < 2; ++b) {
      std::vector<int32_t> sample;
      for (int i = 0; i <= cfg.model.seq_length; ++i) sample.push_back((7 * i + 3 * b + 11 * m + r) % 120);
      samples.push_back(sample);
    }
    const MicroBatch mb = MicroBatch::upload(build_micro_batch(samples, 2 * (m * d + r), cfg.diffusion, {}), rt.stream);
    Tensor loss = Tensor::zeros({1}, DType::F32, rt.stream);
    ModelRecord rec;
    f.set_last_micro_batch(m == M - 1);
    model.forward(mb, rec, loss, 1e-3f, rt);
    model.backward(mb, rec, rt);
  }
  f.finish_grad_sync();  // checks that every unit was released
  return {f.trace(), f.stats(), static_cast<int>(units.size()), static_cast<int>(store.buckets().size())};
}

TEST(FsdpSchedule, GathersReleasesAndReductionsFollowTheStrategy) {
  using K = FsdpAction::Kind;
  for (const auto& group : groups_to_test()) {
    const int d = group ? group->size() : 1;
    for (ShardingStrategy s : kStrategies) {
      for (int M : {1, 3}) {
        for (bool recompute : {false, true}) {
          SCOPED_TRACE(std::string(sharding_strategy_name(s)) + ", d " + std::to_string(d) + ", M " +
                       std::to_string(M) + (recompute ? ", recompute" : ""));
          const ScheduleRun run = run_schedule(s, group, M, recompute);
          ASSERT_EQ(run.units, 4);  // embedding, 2 layers, head (untied: one bucket each)
          ASSERT_EQ(run.buckets, 4);
          std::map<int, int> gathers, releases, rs, reduces;
          for (const FsdpAction& a : run.trace) {
            if (a.kind == K::Gather) ++gathers[a.unit];
            if (a.kind == K::Release) ++releases[a.unit];
            if (a.kind == K::ReduceScatter) ++rs[a.unit];
            if (a.kind == K::Reduce) ++reduces[a.unit];
          }
          const bool zero3 = s == ShardingStrategy::OptimGradsParams;
          const bool sharded_grads = zero3 || s == ShardingStrategy::OptimGrads;
          for (int u = 0; u < run.units; ++u) {
            // Forward and backward gather: recomputation reuses the backward's gather.
            EXPECT_EQ(gathers[u], zero3 ? 2 * M : 0) << "unit " << u;
            EXPECT_EQ(releases[u], gathers[u]) << "unit " << u;
            // optim_grads*: every micro-batch's slot reduce-scattered (also with one rank: the
            // slot is added into the shard). no_shard / optim: one all-reduce / in-place
            // reduce-scatter of the accumulated bucket per step (nothing to do with one rank).
            // The head (the last unit) without TP is the fused head: its output layer's
            // gradient is written in the forward, inside a slot of its own, and the final
            // norm's in the backward: two reduce-scatters per micro-batch.
            const int per_micro_batch = u == run.units - 1 ? 2 : 1;
            EXPECT_EQ(rs[u], sharded_grads ? per_micro_batch * M : 0) << "unit " << u;
            EXPECT_EQ(reduces[u], !sharded_grads && d > 1 ? 1 : 0) << "unit " << u;
          }
          if (zero3) {
            EXPECT_LE(run.stats.max_gathered_units, 2);
            EXPECT_LE(run.stats.max_grad_slot_units, 2);
            // Forward: unit i + 1's gather is issued before unit i is released (overlap).
            for (size_t k = 0; k < run.trace.size(); ++k) {
              const FsdpAction& a = run.trace[k];
              if (a.kind != K::Done || a.unit + 1 >= run.units) continue;
              bool next_gathered = false;
              for (size_t j = k; j-- > 0 && !next_gathered;) {
                if (run.trace[j].kind == K::Gather && run.trace[j].unit == a.unit + 1) next_gathered = true;
                if (run.trace[j].kind == K::Release && run.trace[j].unit == a.unit + 1) break;
              }
              EXPECT_TRUE(next_gathered) << "unit " << a.unit + 1 << " not prefetched before unit "
                                         << a.unit << " was released (trace entry " << k << ")";
            }
          }
          if (sharded_grads) {
            EXPECT_LE(run.stats.max_grad_slot_units, 2);
          }
          // Every rank of the group issues the same collectives in the same order (an
          // order kept in a set, Megatron-LM#2218, would hang): the traces' fingerprints agree.
          if (group) {
            uint64_t h = 1469598103934665603ull;
            for (const FsdpAction& a : run.trace) {
              if (a.kind != K::Gather && a.kind != K::ReduceScatter && a.kind != K::Reduce) continue;
              h = (h ^ (static_cast<uint64_t>(a.kind) * 1000003u + static_cast<uint64_t>(a.bucket))) * 1099511628211ull;
            }
            const float fingerprint = static_cast<float>(h % 16777213);  // exact in fp32
            Tensor lo = Tensor::from_floats({fingerprint}, {1}), hi = Tensor::from_floats({fingerprint}, {1});
            group->all_reduce(lo, comm::ReduceOp::Min, Stream::cpu());
            group->all_reduce(hi, comm::ReduceOp::Max, Stream::cpu());
            EXPECT_EQ(lo.data<float>()[0], hi.data<float>()[0]) << "collective order differs between ranks";
          }
        }
      }
    }
  }
}

}  // namespace
