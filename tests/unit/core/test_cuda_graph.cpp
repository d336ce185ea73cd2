// core/cuda_graph.h on the CPU: GraphSchedule, the rule that decides when a repeated call runs
// eagerly, is captured or replays (block decoding's --cuda-graphs), and CudaGraph's refusal of
// the CPU stream. (Captures and replays on a GPU: tests/gpu/test_parity_block_decoding.cpp,
// BlockDecodingParity.CudaGraphs*.)
#include <gtest/gtest.h>
#include <string>
#include <vector>
#include "megadlm/core/cuda_graph.h"
#include "megadlm/core/error.h"

using namespace megadlm;

namespace {

std::vector<std::string> actions(GraphSchedule& g, const std::vector<GraphSchedule::Key>& keys) {
  std::vector<std::string> out;
  for (const GraphSchedule::Key& k : keys) out.push_back(graph_action_name(g.next(k)));
  return out;
}

}  // namespace

TEST(GraphSchedule, TheHeadersWorkedExample) {
  // Prefill at column 0, then two blocks of three steps at columns 4 and 8; the first block's
  // cache update has its steps' shape and column.
  const std::vector<int64_t> s = {2, 4, 12, 0};
  GraphSchedule g;
  EXPECT_EQ(actions(g, {{s, 0}, {s, 4}, {s, 4}, {s, 4}, {s, 4}, {s, 8}, {s, 8}, {s, 8}}),
            (std::vector<std::string>{"eager", "capture", "replay", "replay", "replay", "capture", "replay", "replay"}));
  EXPECT_EQ(g.eager(), 1);
  EXPECT_EQ(g.captures(), 2);
  EXPECT_EQ(g.replays(), 5);
}

TEST(GraphSchedule, ANewShapeRunsEagerlyFirstAndALeftSiteIsRecaptured) {
  const std::vector<int64_t> a = {1, 4, 20, 0}, causal = {1, 4, 20, 1};
  GraphSchedule g;
  // The causal variant's cache update: a shape of its own, eager once, then captured per column
  // like the steps; coming back to a column whose graph was dropped captures it again.
  EXPECT_EQ(actions(g, {{causal, 0}, {a, 4}, {a, 4}, {a, 4}, {causal, 4}, {a, 8}, {a, 8}, {a, 4}}),
            (std::vector<std::string>{"eager", "eager", "capture", "replay", "capture", "capture", "replay",
                                      "capture"}));
}

TEST(GraphSchedule, ResetForgetsTheGraphAndTheWarmShapes) {
  const std::vector<int64_t> s = {4, 4, 20, 0};
  GraphSchedule g;
  EXPECT_EQ(actions(g, {{s, 0}, {s, 4}, {s, 4}}), (std::vector<std::string>{"eager", "capture", "replay"}));
  g.reset();  // a new cache: the graph wrote into the old one's storage
  EXPECT_EQ(actions(g, {{s, 4}, {s, 4}, {s, 4}}), (std::vector<std::string>{"eager", "capture", "replay"}));
  EXPECT_EQ(g.eager(), 2);  // counts survive the reset
  EXPECT_EQ(g.captures(), 2);
  EXPECT_EQ(g.replays(), 2);
}

TEST(GraphSchedule, EveryPartOfTheShapeCounts) {
  GraphSchedule g;
  EXPECT_EQ(g.next({{1, 4, 20, 0}, 0}), GraphAction::Eager);
  EXPECT_EQ(g.next({{2, 4, 20, 0}, 0}), GraphAction::Eager);   // batch
  EXPECT_EQ(g.next({{1, 4, 24, 0}, 0}), GraphAction::Eager);   // cache length
  EXPECT_EQ(g.next({{1, 4, 20, 0}, 4}), GraphAction::Capture);  // a warm shape at a new site
  EXPECT_EQ(g.next({{1, 4, 20, 0}, 4}), GraphAction::Replay);
  EXPECT_EQ(g.next({{2, 4, 20, 0}, 4}), GraphAction::Capture);  // warm too: replaces the graph
  EXPECT_EQ(g.next({{1, 4, 20, 0}, 4}), GraphAction::Capture);
}

TEST(CudaGraph, CapturingTheCpuStreamIsRefusedNamingTheCaller) {
  CudaGraph graph;
  bool ran = false;
  try {
    graph.capture(Stream::cpu(), [&] { ran = true; }, "--cuda-graphs (a test)");
    ADD_FAILURE() << "captured the CPU stream";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graphs (a test)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA stream"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(ran);
  EXPECT_TRUE(graph.empty());
  EXPECT_EQ(graph.nodes(), 0u);
  EXPECT_THROW(graph.replay(Stream::cpu()), Error);
}
