// Activation memory under context parallelism: the bytes a rank's model record keeps for
// backward (model/saved_activations.h) after a training forward of one micro-batch at CP = world
// are exactly 1/CP of those of the same micro-batch in one process, for every comm type (each
// keeps q, k, v, lse of as many elements as its rows hold: p2p and all_gather this rank's rows,
// a2a and a2a+p2p the level-1 block's rows for 1/a of the heads). Priced as a bf16 CUDA run.
#include <gtest/gtest.h>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/model/saved_activations.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/parallelize.h"
#include "support/spmd.h"
#include "support/tiny_model.h"

using namespace megadlm;

namespace {

HostMicroBatch micro_batch(int64_t batch, int64_t seq) {
  HostMicroBatch h;
  h.batch = batch;
  h.seq = seq;
  for (int64_t i = 0; i < batch * seq; ++i) {
    h.input_ids.push_back(static_cast<int32_t>(1 + i % 50));
    h.labels.push_back(static_cast<int32_t>(2 + i % 50));
    h.loss_weights.push_back(1.0f);
    h.positions.push_back(static_cast<int32_t>(i % seq));
  }
  h.loss_tokens = static_cast<double>(batch * seq);
  return h;
}

SavedActivationBytes forward_bytes(const RunConfig& cfg, const parallel::ProcessGroups* groups,
                                   const HostMicroBatch& h) {
  auto pm = parallelize(cfg, groups);
  const ModelParallel& mp = pm->model_parallel;
  const Stream& s = pm->runtime.stream;
  const MicroBatch mb = MicroBatch::upload(h, s, mp.cp.rank, mp.cp.size);
  ModelRecord rec;
  Tensor loss = Tensor::zeros({1}, DType::F32, s);
  pm->chunks[0]->forward(mb, rec, loss, 1.0f, pm->runtime);
  return saved_activation_bytes(rec, DType::BF16);
}

}  // namespace

TEST(ContextParallelMemory, SavedActivationsPerRankAreOneOverCp) {
  comm::DistributedRuntime& rt = test::spmd::mpi_runtime();
  const int cp = rt.world().size();
  const HostMicroBatch h = micro_batch(2, 32);
  RunConfig one = test::tiny_run({.query_groups = 4, .seq = 32}, 1);
  const SavedActivationBytes whole = forward_bytes(one, nullptr, h);
  ASSERT_GT(whole.layers, 0);
  for (const char* type : {"p2p", "all_gather", "a2a", "a2a+p2p"}) {
    if (std::string(type) == "a2a+p2p" && cp % 2 != 0) continue;
    SCOPED_TRACE(type);
    RunConfig cfg = one;
    cfg.parallel.world_size = cfg.parallel.context_parallel_size = cp;
    cfg.parallel.cp_comm_type = {cp::comm_type_from_name(type)};
    if (std::string(type) == "a2a+p2p") cfg.parallel.hierarchical_context_parallel_sizes = {2, cp / 2};
    const parallel::ProcessGroups groups = parallel::ProcessGroups::build(rt.world_shared(), cfg.parallel);
    const SavedActivationBytes split = forward_bytes(cfg, &groups, h);
    EXPECT_EQ(split.layers * cp, whole.layers);
    EXPECT_EQ(split.head * cp, whole.head);
  }
}
