// The NCCL communicator on CUDA tensors, as an SPMD program (2, 4 or 8 ranks; one GPU each, or
// all on one GPU through the wrapper):
//   mpirun -np 2 build/bin/gpu_nccl
//   mpirun -np 8 scripts/shared_gpu_rank.sh build/bin/gpu_nccl
// The exact checks of the MPI suite (support/comm_checks.h) in bf16 and f32, stream-ordered on
// a non-default stream, split groups, process groups, and synchronize()'s timeout when a rank
// skips a collective (last, on its own group). Without a GPU or 2 ranks every test skips and
// says why.
#include <gtest/gtest.h>
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/device.h"
#include "megadlm/parallel/process_groups.h"
#include "support/comm_checks.h"
#include "support/spmd.h"

using namespace megadlm;
using namespace megadlm::test;
using comm::ReduceOp;

namespace {

class NcclWorld : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    runtime_ = spmd::runtime(comm::Transport::Nccl, &why);
    if (runtime_ == nullptr) GTEST_SKIP() << why;
    stream_ = Stream::create(runtime_->device());
  }
  comm::Communicator& world() { return runtime_->world(); }
  comm::DistributedRuntime* runtime_ = nullptr;
  Stream stream_;
};

ParallelConfig tp_config(int world, int tp) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.expert_tensor_parallel_size = tp;
  c.data_parallel_size = world / tp;
  c.expert_data_parallel_size = world / tp;
  return c;
}

/// A layout with the given sizes; dp and expert-dp are what is left of the world.
ParallelConfig group_layout(int world, int tp, int cp, int pp, int ep) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.context_parallel_size = cp;
  c.pipeline_model_parallel_size = pp;
  c.expert_model_parallel_size = ep;
  c.expert_tensor_parallel_size = 1;
  c.data_parallel_size = world / (tp * cp * pp);
  c.expert_data_parallel_size = world / (ep * pp);
  return c;
}

/// Layouts that together give each of tp, cp, dp, ep and pp a group of 2 or more ranks, for a
/// world of 2, 4 or 8 (several dimensions at once where the world allows it, so that groups of
/// strided members are exercised too; every size is a power of two).
std::vector<ParallelConfig> layouts_with_every_group(int world) {
  if (world >= 8)
    return {group_layout(world, 2, 2, 1, 2), group_layout(world, 1, 1, 2, 1)};  // tp2 cp2 dp2 ep2; pp2 dp4
  if (world >= 4)
    return {group_layout(world, 2, 1, 1, 2), group_layout(world, 1, 2, 2, 1)};  // tp2 dp2 ep2; cp2 pp2
  return {group_layout(world, 2, 1, 1, 1), group_layout(world, 1, 2, 1, 1), group_layout(world, 1, 1, 2, 1),
          group_layout(world, 1, 1, 1, 2)};  // tp2; cp2; pp2; dp2 ep2
}

/// Every collective, exactly, on `g` (support/comm_checks.h): the same calls on every rank.
void check_every_collective(comm::Communicator& g, const Stream& s) {
  for (DType d : {DType::BF16, DType::F32}) {
    check_all_reduce(g, s, d, ReduceOp::Sum);
    check_all_gather(g, s, d, false);
    check_reduce_scatter(g, s, d, ReduceOp::Sum, false);
    check_uneven_all_to_all(g, s, d);
    check_send_recv_pairs(g, s, d);
    check_batch_p2p_ring(g, s, d);
  }
  check_all_reduce(g, s, DType::F32, ReduceOp::Max);
  check_broadcast_from_every_root(g, s, DType::BF16);
}

}  // namespace

TEST_F(NcclWorld, BindsTheGpuOfItsLocalRank) {
  if (world().rank() == 0)
    std::printf("[nccl] runtime version %s, %d rank(s) on %d GPU(s)%s\n", comm::nccl_version().c_str(),
                world().size(), cuda_device_count(), spmd::shared_gpu() ? " (shared GPU)" : "");
  EXPECT_EQ(world().device(), spmd::expected_device(runtime_->environment()));
  EXPECT_EQ(world().size(), runtime_->environment().world_size);
  EXPECT_EQ(world().rank(), runtime_->environment().rank);
  EXPECT_EQ(world().name(), "world");
}

TEST_F(NcclWorld, AllReduceIsExactInBf16AndF32) {
  for (DType d : {DType::BF16, DType::F32})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) check_all_reduce(world(), stream_, d, op);
  // Avg: NCCL premultiplies by 1/size, exact for a power-of-two group (see comm_checks.h).
  if ((world().size() & (world().size() - 1)) == 0)
    for (DType d : {DType::BF16, DType::F32}) check_all_reduce(world(), stream_, d, ReduceOp::Avg);
  for (DType d : {DType::F64, DType::I32, DType::I64}) check_all_reduce(world(), stream_, d, ReduceOp::Sum);
}

TEST_F(NcclWorld, ReduceScatterIsExact) {
  for (bool in_place : {false, true})
    for (DType d : {DType::BF16, DType::F32}) check_reduce_scatter(world(), stream_, d, ReduceOp::Sum, in_place);
  check_reduce_scatter(world(), stream_, DType::F32, ReduceOp::Max, false);
}

TEST_F(NcclWorld, AllGatherIsExact) {
  for (bool in_place : {false, true})
    for (DType d : {DType::BF16, DType::F32}) check_all_gather(world(), stream_, d, in_place);
}

TEST_F(NcclWorld, BroadcastFromEveryRoot) {
  for (DType d : {DType::BF16, DType::F32}) check_broadcast_from_every_root(world(), stream_, d);
}

TEST_F(NcclWorld, UnevenAllToAll) {
  for (DType d : {DType::BF16, DType::F32}) check_uneven_all_to_all(world(), stream_, d);
}

TEST_F(NcclWorld, SendRecvPairs) {
  for (DType d : {DType::BF16, DType::F32}) check_send_recv_pairs(world(), stream_, d);
}

TEST_F(NcclWorld, BatchP2PRingBothDirections) {
  for (DType d : {DType::BF16, DType::F32}) check_batch_p2p_ring(world(), stream_, d);
}

TEST_F(NcclWorld, BarrierAndSynchronize) {
  for (int i = 0; i < 3; ++i) world().barrier(stream_);
  world().synchronize(stream_);
}

TEST_F(NcclWorld, SplitGroupsWork) {
  check_split_even_odd(world(), stream_);
  std::unique_ptr<comm::Communicator> dup = world().split(0, world().rank(), "dup");
  ASSERT_NE(dup, nullptr);
  check_all_reduce(*dup, stream_, DType::BF16, ReduceOp::Sum);
  check_batch_p2p_ring(*dup, stream_, DType::F32);
}

TEST_F(NcclWorld, ProcessGroupsMatchTheRankLayout) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "tp = 2 needs an even world";
  check_process_groups(runtime_->world_shared(), stream_, tp_config(world().size(), 2));
  check_process_groups(runtime_->world_shared(), stream_, tp_config(world().size(), 1));
}

// tp, cp, dp, ep and pp groups (ncclCommSplit of the world), each with 2 or more ranks in some
// layout: every collective exact inside it. All ranks visit the kinds in the same order, so the
// collectives of different groups cannot interleave into a deadlock.
TEST_F(NcclWorld, EveryCollectiveIsExactInEveryGroupKind) {
  using Slot = std::shared_ptr<comm::Communicator> parallel::ProcessGroups::*;
  const std::pair<const char*, Slot> kinds[] = {{"tp", &parallel::ProcessGroups::tp},
                                                {"cp", &parallel::ProcessGroups::cp},
                                                {"dp", &parallel::ProcessGroups::dp},
                                                {"ep", &parallel::ProcessGroups::ep},
                                                {"pp", &parallel::ProcessGroups::pp}};
  std::map<std::string, int> largest;
  for (const ParallelConfig& c : layouts_with_every_group(world().size())) {
    check_process_groups(runtime_->world_shared(), stream_, c);
    const parallel::ProcessGroups pg = parallel::ProcessGroups::build(runtime_->world_shared(), c);
    for (const auto& [name, slot] : kinds) {
      const std::shared_ptr<comm::Communicator>& g = pg.*slot;
      ASSERT_NE(g, nullptr) << name;
      largest[name] = std::max(largest[name], g->size());
      if (g->size() < 2) continue;  // a local group: nothing crosses NCCL
      SCOPED_TRACE(std::string("group kind ") + name + " ('" + g->name() + "')");
      check_every_collective(*g, stream_);
    }
  }
  for (const auto& [name, slot] : kinds) EXPECT_GE(largest[name], 2) << "no layout gave " << name << " 2 ranks";
}

TEST_F(NcclWorld, RefusesTensorsOfTheHostAndStreamsOfAnotherDevice) {
  Tensor host = Tensor::zeros({4}, DType::F32, Stream::cpu());
  EXPECT_THROW(world().all_reduce(host, ReduceOp::Sum, stream_), Error);
  Tensor dev = Tensor::zeros({4}, DType::F32, stream_);
  EXPECT_THROW(world().all_reduce(dev, ReduceOp::Sum, Stream::cpu()), Error);
  Tensor wrong = Tensor::zeros({4 * world().size() + 1}, DType::F32, stream_);
  EXPECT_THROW(world().all_gather(dev, wrong, stream_), Error);
  Tensor ints = Tensor::zeros({4}, DType::I32, stream_);
  EXPECT_THROW(world().all_reduce(ints, ReduceOp::Avg, stream_), Error);
  // The group still works after the refusals (they are raised before anything is queued).
  check_all_reduce(world(), stream_, DType::F32, ReduceOp::Sum);
}

// Last (gtest runs a file's tests in order): leaves one group aborted. Every rank but 0 skips an
// all_reduce on a duplicate of the world whose timeout is 3 s; rank 0's synchronize() must raise
// CommTimeoutError naming the group, the operation and the rank, within a few seconds of the
// timeout.
TEST_F(NcclWorld, SynchronizeTimesOutWhenARankSkipsACollective) {
  std::unique_ptr<comm::Communicator> probe = world().split(0, world().rank(), "timeout-probe");
  ASSERT_NE(probe, nullptr);
  probe->set_timeout(std::chrono::seconds(3));
  Tensor t = Tensor::zeros({1024}, DType::F32, stream_);
  // Once together, so NCCL's connections for this operation exist before a rank goes missing.
  probe->all_reduce(t, ReduceOp::Sum, stream_);
  probe->synchronize(stream_);
  const Stream other = Stream::create(runtime_->device());
  if (world().rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    std::string where = "nowhere";
    try {
      where = "all_reduce";
      probe->all_reduce(t, ReduceOp::Sum, stream_);
      where = "synchronize";
      probe->synchronize(stream_);
      ADD_FAILURE() << "the all_reduce completed although the other ranks skipped it";
    } catch (const comm::CommTimeoutError& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      const std::string msg = e.what();
      EXPECT_EQ(where, "synchronize") << "raised by " << where << ": " << msg;
      const std::string of = "rank 0 of " + std::to_string(world().size());
      for (const std::string& part : {std::string("all_reduce #2"), std::string("group 'timeout-probe'"), of,
                                      std::string("timeout 3000 ms")})
        EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' missing from: " << msg;
      EXPECT_GE(waited, std::chrono::seconds(3));
      EXPECT_LT(waited, std::chrono::seconds(15));
    }
    probe->abort();  // stops the kernel still waiting for the others
  }
  // The others tear their side down only after rank 0 has seen the timeout (the world barrier),
  // so that rank 0 observes silent peers rather than vanished ones.
  world().barrier(other);
  world().synchronize(other);
  if (world().rank() != 0) probe->abort();
  // The world is unaffected.
  check_all_reduce(world(), other, DType::F32, ReduceOp::Sum);
}
