// The MPI communicator on CPU tensors, as an SPMD program (mpirun -np 2 / -np 4): every
// operation checked exactly (support/comm_checks.h) on the world and on split groups, the
// process groups of small layouts against RankLayout, and the argument errors each operation
// raises. Run without mpirun it is a world of one (the self communicator) and the multi-rank
// tests skip.
#include <gtest/gtest.h>
#include <functional>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/parallel/process_groups.h"
#include "support/comm_checks.h"
#include "support/spmd.h"

using namespace megadlm;
using namespace megadlm::test;
using comm::ReduceOp;

namespace {

class MpiWorld : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = spmd::runtime(comm::Transport::Mpi, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
  }
  comm::Communicator& world() { return runtime_->world(); }
  std::shared_ptr<comm::Communicator> world_shared() { return runtime_->world_shared(); }
  int size() { return world().size(); }
  const Stream stream_ = Stream::cpu();
  comm::DistributedRuntime* runtime_ = nullptr;
};

/// Expects `fn` to throw megadlm::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing from: " << msg;
  }
}

ParallelConfig layout_config(int world, int tp, int pp, int cp, int instances = 1) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  c.context_parallel_size = cp;
  c.expert_tensor_parallel_size = tp;
  c.data_parallel_size = world / (tp * pp * cp);
  c.expert_data_parallel_size = world / (tp * pp);
  c.num_distributed_optimizer_instances = instances;
  c.use_distributed_optimizer = instances > 1;
  return c;
}

}  // namespace

TEST_F(MpiWorld, KnowsItsRankSizeAndNames) {
  const comm::LaunchEnvironment& env = runtime_->environment();
  EXPECT_EQ(world().size(), env.world_size);
  EXPECT_EQ(world().rank(), env.rank);
  EXPECT_EQ(world().name(), "world");
  EXPECT_EQ(world().device(), Device::cpu());
  EXPECT_EQ(world().timeout(), spmd::kTimeout);
  for (int r = 0; r < size(); ++r) EXPECT_EQ(world().global_rank(r), r);
}

TEST_F(MpiWorld, AllReduceIsExactForEveryOpAndDtype) {
  for (DType d : {DType::F32, DType::F64, DType::I32, DType::I64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) check_all_reduce(world(), stream_, d, op);
  for (DType d : {DType::F32, DType::F64}) check_all_reduce(world(), stream_, d, ReduceOp::Avg);
}

TEST_F(MpiWorld, ReduceScatterIsExact) {
  for (bool in_place : {false, true}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
      check_reduce_scatter(world(), stream_, DType::F32, op, in_place);
    check_reduce_scatter(world(), stream_, DType::I64, ReduceOp::Sum, in_place);
  }
}

TEST_F(MpiWorld, AllGatherMovesEveryDtype) {
  for (bool in_place : {false, true})
    for (DType d : {DType::F32, DType::BF16, DType::F64, DType::I32}) check_all_gather(world(), stream_, d, in_place);
}

TEST_F(MpiWorld, BroadcastFromEveryRoot) {
  for (DType d : {DType::F32, DType::BF16}) check_broadcast_from_every_root(world(), stream_, d);
}

TEST_F(MpiWorld, UnevenAllToAllWithEmptyBlocks) {
  for (DType d : {DType::F32, DType::BF16, DType::I64}) check_uneven_all_to_all(world(), stream_, d);
}

TEST_F(MpiWorld, SendRecvPairs) {
  if (size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  for (DType d : {DType::F32, DType::BF16}) check_send_recv_pairs(world(), stream_, d);
}

TEST_F(MpiWorld, BatchP2PRingBothDirections) {
  for (DType d : {DType::F32, DType::BF16}) check_batch_p2p_ring(world(), stream_, d);
}

TEST_F(MpiWorld, BarrierReturnsOnEveryRank) {
  for (int i = 0; i < 3; ++i) world().barrier(stream_);
  world().synchronize(stream_);
}

TEST_F(MpiWorld, SplitByParityAndCollectivesInsideIt) {
  if (size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  check_split_even_odd(world(), stream_);
}

TEST_F(MpiWorld, CollectivesInsideSplitGroupsAreExact) {
  if (size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  std::unique_ptr<comm::Communicator> half = world().split(world().rank() % 2, world().rank(), "half");
  ASSERT_NE(half, nullptr);
  check_all_reduce(*half, stream_, DType::F32, ReduceOp::Sum);
  check_reduce_scatter(*half, stream_, DType::F32, ReduceOp::Sum, false);
  check_all_gather(*half, stream_, DType::BF16, true);
  check_uneven_all_to_all(*half, stream_, DType::F32);
  check_batch_p2p_ring(*half, stream_, DType::F32);
  // A split of a split: global ranks still refer to the world.
  std::unique_ptr<comm::Communicator> quarter = half->split(half->rank() % 2, 0, "quarter");
  ASSERT_NE(quarter, nullptr);
  EXPECT_EQ(quarter->global_rank(quarter->rank()), world().rank());
  check_all_reduce(*quarter, stream_, DType::F64, ReduceOp::Max);
}

TEST_F(MpiWorld, ProcessGroupsOfTp2MatchTheRankLayout) {
  if (size() % 2 != 0) GTEST_SKIP() << "tp = 2 needs an even world";
  check_process_groups(world_shared(), stream_, layout_config(size(), 2, 1, 1));
}

TEST_F(MpiWorld, ProcessGroupsOfTp2Pp2MatchTheRankLayout) {
  if (size() % 4 != 0) GTEST_SKIP() << "tp = pp = 2 needs a multiple of 4 ranks";
  check_process_groups(world_shared(), stream_, layout_config(size(), 2, 2, 1));
}

TEST_F(MpiWorld, ProcessGroupsOfCp2MatchTheRankLayout) {
  if (size() % 2 != 0) GTEST_SKIP() << "cp = 2 needs an even world";
  check_process_groups(world_shared(), stream_, layout_config(size(), 1, 1, 2));
}

TEST_F(MpiWorld, ProcessGroupsOfHierarchicalCp4MatchTheRankLayout) {
  if (size() % 4 != 0) GTEST_SKIP() << "cp = 4 needs a multiple of 4 ranks";
  ParallelConfig c = layout_config(size(), 1, 1, 4);
  c.hierarchical_context_parallel_sizes = {2, 2};
  check_process_groups(world_shared(), stream_, c);
}

TEST_F(MpiWorld, ProcessGroupsOfExpertParallelMatchTheRankLayout) {
  if (size() % 2 != 0) GTEST_SKIP() << "ep = 2 needs an even world";
  ParallelConfig c = layout_config(size(), 1, 1, 1);
  c.expert_model_parallel_size = 2;
  c.expert_data_parallel_size = size() / 2;
  check_process_groups(world_shared(), stream_, c);
}

TEST_F(MpiWorld, ProcessGroupsOfDeepPipelineLeaveMiddleStagesOutOfTheEmbeddingGroup) {
  if (size() < 3) GTEST_SKIP() << "needs 3 or more ranks";
  check_process_groups(world_shared(), stream_, layout_config(size(), 1, size(), 1));
}

TEST_F(MpiWorld, ProcessGroupsOfTwoDistributedOptimizerInstances) {
  if (size() % 2 != 0) GTEST_SKIP() << "two instances need an even dp";
  check_process_groups(world_shared(), stream_, layout_config(size(), 1, 1, 1, 2));
}

TEST_F(MpiWorld, ProcessGroupsShareCommunicatorsOfCoincidingGroups) {
  if (size() < 2) GTEST_SKIP() << "needs 2 or more ranks (one-rank groups are never shared)";
  // tp = pp = cp = 1 without experts: dp, dp-cp, the distributed-optimizer group and the
  // expert-dp group are the whole world and share one communicator; tp, cp, pp, tp-pp, tp-cp,
  // ep and expert-tp are one-rank groups.
  const parallel::ProcessGroups pg = parallel::ProcessGroups::build(world_shared(), layout_config(size(), 1, 1, 1));
  EXPECT_EQ(pg.dp, pg.dp_cp);
  EXPECT_EQ(pg.dp, pg.dist_opt_intra);
  EXPECT_EQ(pg.dp, pg.expert_dp);
  EXPECT_EQ(pg.dp->name(), "dp=dp-cp=dist-opt-intra=expert-dp");
  EXPECT_EQ(pg.ep->size(), 1);
  EXPECT_EQ(pg.expert_tp->size(), 1);
  EXPECT_TRUE(pg.hierarchical_cp.empty());
  EXPECT_EQ(pg.dp->size(), size());
  EXPECT_EQ(pg.tp->size(), 1);
  EXPECT_EQ(pg.tp->global_rank(0), world().rank());
  EXPECT_EQ(pg.dist_opt_inter, nullptr);
}

TEST_F(MpiWorld, ProcessGroupsRejectAConfigForAnotherWorldSize) {
  expect_error([&] { parallel::ProcessGroups::build(world_shared(), layout_config(2 * size(), 2, 1, 1)); },
               {"world communicator", std::to_string(size())});
}

TEST_F(MpiWorld, ArgumentErrorsNameGroupOperationAndWhatIsValid) {
  // Every rank raises the same local error before any message moves, so the group stays usable.
  const std::string rank = "rank " + std::to_string(world().rank());
  Tensor bf = Tensor::zeros({4}, DType::BF16, stream_);
  expect_error([&] { world().all_reduce(bf, ReduceOp::Sum, stream_); },
               {"all_reduce", "'world'", rank, "bf16", "f32"});
  Tensor ints = Tensor::zeros({4}, DType::I32, stream_);
  expect_error([&] { world().all_reduce(ints, ReduceOp::Avg, stream_); }, {"Avg", "i32"});
  Tensor in = Tensor::zeros({3 * size() + 1}, DType::F32, stream_), out = Tensor::zeros({3}, DType::F32, stream_);
  expect_error([&] { world().reduce_scatter(in, out, ReduceOp::Sum, stream_); },
               {"reduce_scatter", "'world'", rank, std::to_string(3 * size())});
  Tensor gathered = Tensor::zeros({2 * size()}, DType::F64, stream_), piece = Tensor::zeros({2}, DType::F32, stream_);
  expect_error([&] { world().all_gather(piece, gathered, stream_); }, {"all_gather", "dtype"});
  Tensor t = Tensor::zeros({2}, DType::F32, stream_);
  expect_error([&] { world().broadcast(t, size(), stream_); },
               {"broadcast", "root " + std::to_string(size()), "0.." + std::to_string(size() - 1)});
  expect_error([&] { world().send(t, world().rank(), stream_); }, {"send", "batch_p2p"});
  expect_error([&] { world().recv(t, -1, stream_); }, {"recv", "peer -1"});
  std::vector<int64_t> counts(static_cast<size_t>(size()), 1);
  Tensor a2a_in = Tensor::zeros({size()}, DType::F32, stream_), a2a_out = Tensor::zeros({size() + 1}, DType::F32, stream_);
  expect_error([&] { world().all_to_all(a2a_in, counts, a2a_out, counts, stream_); },
               {"all_to_all", "recv_counts sum to " + std::to_string(size())});
  expect_error([&] { world().set_timeout(std::chrono::milliseconds(0)); }, {"positive"});
  // The group still works after all those refusals.
  check_all_reduce(world(), stream_, DType::F32, ReduceOp::Sum);
}

TEST_F(MpiWorld, AnAbortedGroupRefusesFurtherWork) {
  std::unique_ptr<comm::Communicator> g = world().split(0, world().rank(), "doomed");
  ASSERT_NE(g, nullptr);
  g->abort();
  Tensor t = Tensor::zeros({1}, DType::F32, stream_);
  expect_error([&] { g->all_reduce(t, ReduceOp::Sum, stream_); }, {"aborted", "'doomed'"});
}
