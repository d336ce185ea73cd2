// The one-rank communicator (src/comm/self_communicator.h) and ProcessGroups on a world of one:
// every collective is the identity or a local copy, argument checks match the multi-rank
// transports (so code that runs on one rank runs on many), and split/abort behave as documented.
#include <gtest/gtest.h>
#include "comm/self_communicator.h"
#include "megadlm/parallel/process_groups.h"

using namespace megadlm;
using namespace megadlm::comm;
using megadlm::comm::detail::SelfCommunicator;
using megadlm::parallel::ProcessGroups;

namespace {

SelfCommunicator make(const char* name = "world") {
  return SelfCommunicator(name, Device::cpu(), 0, std::chrono::seconds(1), nullptr);
}

std::vector<float> floats(const Tensor& t) { return t.to_floats(Stream::cpu()); }

}  // namespace

TEST(SelfCommunicator, CollectivesAreIdentitiesOrCopies) {
  SelfCommunicator c = make();
  const Stream s = Stream::cpu();
  Tensor t = Tensor::from_floats({1, 2, 3}, {3});
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    c.all_reduce(t, op, s);
    EXPECT_EQ(floats(t), (std::vector<float>{1, 2, 3}));
  }
  Tensor out = Tensor::zeros({3}, DType::F32, s);
  c.reduce_scatter(t, out, ReduceOp::Sum, s);
  EXPECT_EQ(floats(out), (std::vector<float>{1, 2, 3}));
  Tensor gathered = Tensor::zeros({3}, DType::F32, s);
  c.all_gather(t, gathered, s);
  EXPECT_EQ(floats(gathered), (std::vector<float>{1, 2, 3}));
  c.all_gather(gathered, gathered, s);  // in place
  c.broadcast(t, 0, s);
  Tensor a2a = Tensor::zeros({3}, DType::F32, s);
  c.all_to_all(t, {3}, a2a, {3}, s);
  EXPECT_EQ(floats(a2a), (std::vector<float>{1, 2, 3}));
  c.barrier(s);
  c.synchronize(s);
}

TEST(SelfCommunicator, BatchP2PToItselfMatchesInOrder) {
  SelfCommunicator c = make();
  const Stream s = Stream::cpu();
  Tensor a = Tensor::from_floats({1, 2}, {2}), b = Tensor::from_floats({3, 4}, {2});
  Tensor ra = Tensor::zeros({2}, DType::F32, s), rb = Tensor::zeros({2}, DType::F32, s);
  c.batch_p2p({{P2POp::Kind::Recv, ra, 0}, {P2POp::Kind::Send, a, 0},
               {P2POp::Kind::Send, b, 0}, {P2POp::Kind::Recv, rb, 0}}, s);
  EXPECT_EQ(floats(ra), (std::vector<float>{1, 2}));
  EXPECT_EQ(floats(rb), (std::vector<float>{3, 4}));
  EXPECT_THROW(c.batch_p2p({{P2POp::Kind::Send, a, 0}}, s), Error);
}

TEST(SelfCommunicator, RefusesWhatTheMultiRankTransportsRefuse) {
  SelfCommunicator c = make("tp");
  const Stream s = Stream::cpu();
  Tensor t = Tensor::from_floats({1, 2}, {2});
  EXPECT_THROW(c.send(t, 0, s), Error);        // to itself outside a batch
  EXPECT_THROW(c.broadcast(t, 1, s), Error);   // no rank 1
  Tensor bf = Tensor::from_floats({1, 2}, {2}, DType::BF16);
  try {
    c.all_reduce(bf, ReduceOp::Sum, s);  // the CPU (MPI) cannot reduce bf16
    ADD_FAILURE() << "reduced bf16 on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 'tp' (rank 0 of 1"), std::string::npos) << e.what();
  }
  Tensor wrong = Tensor::zeros({3}, DType::F32, s);
  EXPECT_THROW(c.all_gather(t, wrong, s), Error);
}

TEST(SelfCommunicator, SplitAndAbort) {
  SelfCommunicator c = make();
  EXPECT_EQ(c.split(-1, 0, "none"), nullptr);
  std::unique_ptr<Communicator> child = c.split(3, 7, "child");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->name(), "child");
  EXPECT_EQ(child->size(), 1);
  child->set_timeout(std::chrono::milliseconds(250));
  EXPECT_EQ(child->timeout(), std::chrono::milliseconds(250));
  child->abort();
  Tensor t = Tensor::from_floats({1}, {1});
  EXPECT_THROW(child->all_reduce(t, ReduceOp::Sum, Stream::cpu()), Error);
}

TEST(ProcessGroups, AWorldOfOneHasOneRankGroupsEverywhere) {
  auto world = std::make_shared<SelfCommunicator>("world", Device::cpu(), 0, std::chrono::seconds(1), nullptr);
  ParallelConfig config;
  const ProcessGroups pg = ProcessGroups::build(world, config);
  for (const auto& g : {pg.tp, pg.cp, pg.dp, pg.dp_cp, pg.pp, pg.model_parallel, pg.tp_cp, pg.embedding,
                        pg.dist_opt_intra}) {
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->size(), 1);
    EXPECT_EQ(g->global_rank(0), 0);
  }
  EXPECT_EQ(pg.tp->name(), "tp");
  EXPECT_EQ(pg.dp_cp->name(), "dp-cp");
  EXPECT_EQ(pg.dist_opt_inter, nullptr);
  ParallelConfig too_big;
  too_big.world_size = 2;
  EXPECT_THROW(ProcessGroups::build(world, too_big), Error);
}
