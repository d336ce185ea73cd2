// FSDP's communication streams over NCCL (part of the gpu_nccl SPMD suite: 2, 4 or 8 ranks, one
// GPU each or all on one GPU through scripts/shared_gpu_rank.sh). The whole world is the FSDP
// group; every rank runs 3 micro-batches of its own samples through a 4-layer tiny model and
// keeps its gradient shard. With FsdpOptions::overlap (the default on CUDA with several ranks)
// the next unit's all-gather is prefetched on the gather stream and every reduce-scatter runs on
// the reduction stream, ordered by events; without it every collective runs on the compute
// stream, blocking. The same NCCL collectives on the same buffers sum in the same order, so the
// two must agree bit for bit: a missing wait reads a window before its gather lands, or reuses a
// gradient slot before its reduce-scatter has read it, and moves bits. With and without full
// recomputation (a second gather per unit in the backward). Training through FSDP against one
// process is in test_layouts_nccl.cpp. Skips without a GPU.
#include <gtest/gtest.h>
#include <cstring>
#include <string>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/parallel/data_parallel/fsdp.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

class FsdpNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = test::spmd::runtime(comm::Transport::Nccl, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
  }

  /// One step of 3 micro-batches under FSDP over the world; this rank's fp32 gradient shard and
  /// the wrapper's counters.
  std::vector<float> grads(ShardingStrategy s, bool overlap, bool recompute, FsdpStats* stats) {
    RunConfig cfg = test::tiny_run({.layers = 4, .hidden = 256, .heads = 4, .query_groups = 2,
                                    .kv_channels = 64, .ffn = 512, .seq = 64, .vocab = 512},
                                   1);
    cfg.model.vocab_size = 500;
    cfg.diffusion.mask_token = 499;
    cfg.model.deterministic_mode = true;  // attention's dQ in a fixed order: run-to-run bitwise
    if (recompute) {
      cfg.model.recompute_granularity = RecomputeGranularity::Full;
      cfg.model.recompute_num_layers = 1;
    }
    const std::shared_ptr<comm::Communicator> group = runtime_->world_shared();
    const int d = group->size(), r = group->rank();
    const Stream stream = Stream::create(runtime_->device());
    ParameterStore store;
    GptModel model(cfg.model, store);
    std::vector<FsdpUnit> units;
    for (std::vector<int>& h : model.param_units()) units.push_back({0, std::move(h)});
    store.materialize(DType::BF16, 7, stream,
                      FullyShardedDataParallel::buffer_layout(s, d, units, static_cast<int>(store.descs().size())));
    FullyShardedDataParallel f(store, units, group, {.strategy = s, .overlap = overlap}, stream);
    ModelRuntime rt;
    rt.stream = stream;
    rt.dtype = DType::BF16;
    rt.hooks = &f;
    store.zero_grads(stream);
    f.start_step();
    const int M = 3;
    for (int m = 0; m < M; ++m) {
      std::vector<std::vector<int32_t>> samples;
      for (int b = 0; b < 2; ++b) {
        std::vector<int32_t> sample;
        for (int i = 0; i <= cfg.model.seq_length; ++i) sample.push_back((7 * i + 3 * b + 11 * m + 5 * r) % 498);
        samples.push_back(sample);
      }
      const MicroBatch mb = MicroBatch::upload(build_micro_batch(samples, 2 * (m * d + r), cfg.diffusion, {}), stream);
      Tensor loss = Tensor::zeros({1}, DType::F32, stream);
      ModelRecord rec;
      f.set_last_micro_batch(m == M - 1);
      model.forward(mb, rec, loss, 1e-3f, rt);
      model.backward(mb, rec, rt);
    }
    f.finish_grad_sync();
    std::vector<float> g = f.optimizer_grads().to_floats(stream);
    stream.synchronize();
    *stats = f.stats();
    return g;
  }

  comm::DistributedRuntime* runtime_ = nullptr;
};

}  // namespace

TEST_F(FsdpNccl, CommunicationStreamsGiveTheBlockingPathsGradientsBitForBit) {
  for (ShardingStrategy s : {ShardingStrategy::OptimGrads, ShardingStrategy::OptimGradsParams}) {
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(std::string(sharding_strategy_name(s)) + (recompute ? ", recompute" : "") + ", rank " +
                   std::to_string(runtime_->world().rank()));
      FsdpStats blocking_stats, streamed_stats;
      const std::vector<float> blocking = grads(s, false, recompute, &blocking_stats);
      const std::vector<float> streamed = grads(s, true, recompute, &streamed_stats);
      ASSERT_EQ(blocking.size(), streamed.size());
      double norm = 0;
      size_t differ = 0;
      for (size_t i = 0; i < blocking.size(); ++i) {
        norm += static_cast<double>(blocking[i]) * blocking[i];
        differ += std::memcmp(&blocking[i], &streamed[i], sizeof(float)) != 0;
      }
      EXPECT_GT(norm, 0.0) << "no gradient reached the shard";
      EXPECT_EQ(differ, 0u) << "elements whose bits differ, of " << blocking.size();
      // The same collectives either way: one reduce-scatter per unit and micro-batch (the fused
      // head two), and under optim_grads_params two gathers per unit and micro-batch.
      EXPECT_GT(streamed_stats.reduce_scatters, 0);
      EXPECT_EQ(streamed_stats.reduce_scatters, blocking_stats.reduce_scatters);
      EXPECT_EQ(streamed_stats.all_gathers, blocking_stats.all_gathers);
      if (s == ShardingStrategy::OptimGradsParams) {
        EXPECT_GT(streamed_stats.all_gathers, 0);
      }
      EXPECT_LE(streamed_stats.max_gathered_units, 2);
    }
  }
}
