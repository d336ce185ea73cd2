// Pipeline schedules as action lists (parallel/pipeline_parallel/schedule.h): exact lists derived
// by hand from Megatron's rules (docs/parallelism/pipeline_schedules.md) for small cases, the
// simulator over
// a sweep of every valid (pp, V, M, N, forward_only) up to pp = 8, V = 4, M = 24, planted bugs the
// simulator must catch, and validate()'s messages. Notation as in format_schedule: "F2.1" =
// Forward(micro-batch 2, chunk 1); a bracket is one batched group; "S>" send to next, "S<" send to
// prev, "R<" receive from prev, "R>" receive from next. Everything is integer bookkeeping: exact.
#include <gtest/gtest.h>
#include <algorithm>
#include <string>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/parallel/pipeline_parallel/schedule.h"

using namespace megadlm;
using namespace megadlm::pp;

namespace {

using Lists = std::vector<std::vector<Action>>;

ScheduleConfig config(int pp, int rank, int m, int v = 1, int n = 0, bool forward_only = false) {
  ScheduleConfig c;
  c.pp_rank = rank;
  c.pp_size = pp;
  c.virtual_stages = v;
  c.num_micro_batches = m;
  c.microbatch_group_size = n;
  c.forward_only = forward_only;
  return c;
}

std::string listing(int pp, int rank, int m, int v = 1, int n = 0, bool forward_only = false) {
  return format_schedule(build_schedule(config(pp, rank, m, v, n, forward_only)));
}

Lists all_ranks(int pp, int m, int v = 1, int n = 0, bool forward_only = false) {
  Lists lists;
  for (int r = 0; r < pp; ++r) lists.push_back(build_schedule(config(pp, r, m, v, n, forward_only)));
  return lists;
}

// Only the compute actions, e.g. "F0.0 F1.0 B0.0 …".
std::string compute_order(const std::vector<Action>& actions) {
  std::vector<Action> compute;
  for (const Action& a : actions)
    if (a.type != ActionType::Communicate) compute.push_back(a);
  return format_schedule(compute);
}

std::string validation_error(const ScheduleConfig& c) {
  try {
    validate(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Megatron's posting order inside a group (send_prev, recv_prev, send_next, recv_next).
void use_megatron_posting_order(Lists& lists) {
  auto position = [](Transfer::Kind k) {
    switch (k) {
      case Transfer::Kind::SendPrev: return 0;
      case Transfer::Kind::RecvPrev: return 1;
      case Transfer::Kind::SendNext: return 2;
      case Transfer::Kind::RecvNext: return 3;
    }
    return 4;
  };
  for (auto& list : lists)
    for (auto& a : list)
      std::stable_sort(a.transfers.begin(), a.transfers.end(),
                       [&](const Transfer& x, const Transfer& y) { return position(x.kind) < position(y.kind); });
}

// The most tensors a rank holds received but not yet consumed: inputs (RecvPrev before their
// Forward) or output-gradients (RecvNext before their Backward). What an executor sizes its
// receive buffers by.
int max_waiting(const std::vector<Action>& list, Transfer::Kind kind) {
  const ActionType consumer = kind == Transfer::Kind::RecvPrev ? ActionType::Forward : ActionType::Backward;
  std::vector<std::pair<int, int>> waiting;
  size_t peak = 0;
  for (const Action& a : list) {
    for (const Transfer& t : a.transfers)
      if (t.kind == kind) waiting.emplace_back(t.micro_batch, t.chunk);
    if (a.type == consumer)
      waiting.erase(std::remove(waiting.begin(), waiting.end(), std::make_pair(a.micro_batch, a.chunk)),
                    waiting.end());
    peak = std::max(peak, waiting.size());
  }
  return static_cast<int>(peak);
}

// Indices of the Communicate actions of one list.
std::vector<size_t> communicate_indices(const std::vector<Action>& list) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].type == ActionType::Communicate) idx.push_back(i);
  return idx;
}

}  // namespace

// ---------------------------------------------------------------------------- selection, table

TEST(PipelineSchedule, SelectsTheScheduleLikeMegatron) {
  EXPECT_EQ(schedule_kind(config(1, 0, 4)), ScheduleKind::NoPipelining);
  EXPECT_EQ(schedule_kind(config(2, 0, 4)), ScheduleKind::OneFOneB);
  EXPECT_EQ(schedule_kind(config(2, 0, 4, 2)), ScheduleKind::Interleaved);
}

TEST(PipelineSchedule, TableMatchesTheSpecExamples) {
  auto table_text = [](const std::vector<VirtualMicroBatch>& t) {
    std::string mb, chunk;
    for (const auto& e : t) {
      mb += std::to_string(e.micro_batch) + " ";
      chunk += std::to_string(e.chunk) + " ";
    }
    return mb + "| " + chunk;
  };
  // N = 2 (default pp): groups {0,1}, {2,3}; each group runs chunk 0 then chunk 1.
  EXPECT_EQ(table_text(schedule_table(config(2, 0, 4, 2))), "0 1 0 1 2 3 2 3 | 0 0 1 1 0 0 1 1 ");
  // N = 3, M = 5: group {0,1,2}, then the last group takes the remainder {3,4}.
  EXPECT_EQ(table_text(schedule_table(config(2, 0, 5, 2, 3))), "0 1 2 0 1 2 3 4 3 4 | 0 0 0 1 1 1 0 0 1 1 ");
  // N = 3, M = 7 (7 % 3 = 1 < pp would be rejected; pp = 2 needs remainder 0 or >= 2): use M = 8:
  // groups {0,1,2}, {3,4,5}, {6,7}.
  EXPECT_EQ(table_text(schedule_table(config(2, 0, 8, 2, 3))),
            "0 1 2 0 1 2 3 4 5 3 4 5 6 7 6 7 | 0 0 0 1 1 1 0 0 0 1 1 1 0 0 1 1 ");
  // V = 1: the table is just the micro-batches in order.
  EXPECT_EQ(table_text(schedule_table(config(4, 1, 3))), "0 1 2 | 0 0 0 ");
}

// ---------------------------------------------------------------------------- warm-up counts

TEST(PipelineSchedule, WarmupCountsMatchMegatron) {
  // Interleaved, Megatron's examples (N = pp): 2·(pp − r − 1) + (V − 1)·N.
  //   pp = 4, V = 2, M = 8: 2·3 + 4 = 10, 8, 6, 4 (all below T = 16).
  for (int r = 0; r < 4; ++r) EXPECT_EQ(warmup_micro_batches(config(4, r, 8, 2)), 10 - 2 * r) << r;
  //   pp = 2, V = 2, M = 4: 2 + 2 = 4 and 0 + 2 = 2.
  EXPECT_EQ(warmup_micro_batches(config(2, 0, 4, 2)), 4);
  EXPECT_EQ(warmup_micro_batches(config(2, 1, 4, 2)), 2);
  //   pp = 2, V = 2, N = 3, M = 5: 2 + 3 = 5 and 3.
  EXPECT_EQ(warmup_micro_batches(config(2, 0, 5, 2, 3)), 5);
  EXPECT_EQ(warmup_micro_batches(config(2, 1, 5, 2, 3)), 3);
  //   all warm-up: pp = 4, V = 2, M = 4: rank 0 wants 6 + 4 = 10 > T = 8 → 8; rank 1: 4 + 4 = 8.
  EXPECT_EQ(warmup_micro_batches(config(4, 0, 4, 2)), 8);
  EXPECT_EQ(warmup_micro_batches(config(4, 1, 4, 2)), 8);
  EXPECT_EQ(warmup_micro_batches(config(4, 2, 4, 2)), 6);
  //   forward-only: everything is warm-up.
  EXPECT_EQ(warmup_micro_batches(config(4, 3, 8, 2, 0, true)), 16);
  // 1F1B: min(pp − r − 1, M), forward-only or not.
  EXPECT_EQ(warmup_micro_batches(config(4, 0, 8)), 3);
  EXPECT_EQ(warmup_micro_batches(config(4, 0, 2)), 2);
  EXPECT_EQ(warmup_micro_batches(config(4, 3, 2)), 0);
  EXPECT_EQ(warmup_micro_batches(config(4, 1, 8, 1, 0, true)), 2);
  // No pipelining.
  EXPECT_EQ(warmup_micro_batches(config(1, 0, 8)), 0);
}

// ---------------------------------------------------------------------------- exact lists

TEST(PipelineSchedule, NoPipeliningRunsForwardThenBackwardPerMicroBatch) {
  EXPECT_EQ(listing(1, 0, 3), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  EXPECT_EQ(listing(1, 0, 3, 1, 0, true), "F0.0 F1.0 F2.0");
}

// pp = 2, M = 4.
// Rank 0 (first): w = min(2 − 0 − 1, 4) = 1, R = 3. Warm-up F0.0 + send_forward; recv_forward
// before the steady state is a no-op on the first stage; steady i: F(1 + i), send_forward_recv_
// backward {S>(1+i), R>(i)}, B(i), send_backward(_recv_forward) no-op; cool-down mb 3: recv_backward.
// Rank 1 (last): w = 0, R = 4. recv_forward(0); steady i: F(i), send_forward_recv_backward no-op,
// B(i), send_backward_recv_forward {S<(i), R<(i+1)}, the last step send_backward {S<3.0} only.
TEST(PipelineSchedule, OneFOneBTwoStagesFourMicroBatches) {
  EXPECT_EQ(listing(2, 0, 4),
            "F0.0 [S>0.0] "
            "F1.0 [S>1.0 R>0.0] B0.0 "
            "F2.0 [S>2.0 R>1.0] B1.0 "
            "F3.0 [S>3.0 R>2.0] B2.0 "
            "[R>3.0] B3.0");
  EXPECT_EQ(listing(2, 1, 4),
            "[R<0.0] "
            "F0.0 B0.0 [S<0.0 R<1.0] "
            "F1.0 B1.0 [S<1.0 R<2.0] "
            "F2.0 B2.0 [S<2.0 R<3.0] "
            "F3.0 B3.0 [S<3.0]");
}

// pp = 4, M = 4.
// Rank 0: w = 3, R = 1: three warm-up forwards with send_forward, one steady step (F3.0,
// {S>3.0 R>0.0}, B0.0), then three cool-down backwards each after recv_backward.
// Rank 3: w = 0: like the last rank of pp = 2 above.
// Rank 1: w = 2, R = 2: warm-up [R<i] F [S>i] for i = 0, 1; recv_forward(2); steady 0: F2.0
// {S>2.0 R>0.0} B0.0 {S<0.0 R<3.0}; steady 1 (last): F3.0 {S>3.0 R>1.0} B1.0 {S<1.0};
// cool-down mb 2, 3: [R>] B [S<].
// Rank 2: w = 1, R = 3.
TEST(PipelineSchedule, OneFOneBFourStagesFourMicroBatches) {
  EXPECT_EQ(listing(4, 0, 4),
            "F0.0 [S>0.0] F1.0 [S>1.0] F2.0 [S>2.0] "
            "F3.0 [S>3.0 R>0.0] B0.0 "
            "[R>1.0] B1.0 [R>2.0] B2.0 [R>3.0] B3.0");
  EXPECT_EQ(listing(4, 1, 4),
            "[R<0.0] F0.0 [S>0.0] [R<1.0] F1.0 [S>1.0] "
            "[R<2.0] "
            "F2.0 [S>2.0 R>0.0] B0.0 [S<0.0 R<3.0] "
            "F3.0 [S>3.0 R>1.0] B1.0 [S<1.0] "
            "[R>2.0] B2.0 [S<2.0] [R>3.0] B3.0 [S<3.0]");
  EXPECT_EQ(listing(4, 2, 4),
            "[R<0.0] F0.0 [S>0.0] "
            "[R<1.0] "
            "F1.0 [S>1.0 R>0.0] B0.0 [S<0.0 R<2.0] "
            "F2.0 [S>2.0 R>1.0] B1.0 [S<1.0 R<3.0] "
            "F3.0 [S>3.0 R>2.0] B2.0 [S<2.0] "
            "[R>3.0] B3.0 [S<3.0]");
  EXPECT_EQ(listing(4, 3, 4),
            "[R<0.0] "
            "F0.0 B0.0 [S<0.0 R<1.0] "
            "F1.0 B1.0 [S<1.0 R<2.0] "
            "F2.0 B2.0 [S<2.0 R<3.0] "
            "F3.0 B3.0 [S<3.0]");
}

// pp = 4, M = 2 (fewer micro-batches than stages): w = min(pp − r − 1, 2) = 2, 2, 1, 0.
// Ranks 0 and 1 have no steady state (R = 0: no recv_forward before it), only warm-up and
// cool-down; rank 2 has one steady step, which is also its last (send_backward alone).
TEST(PipelineSchedule, OneFOneBFewerMicroBatchesThanStages) {
  EXPECT_EQ(listing(4, 0, 2), "F0.0 [S>0.0] F1.0 [S>1.0] [R>0.0] B0.0 [R>1.0] B1.0");
  EXPECT_EQ(listing(4, 1, 2),
            "[R<0.0] F0.0 [S>0.0] [R<1.0] F1.0 [S>1.0] "
            "[R>0.0] B0.0 [S<0.0] [R>1.0] B1.0 [S<1.0]");
  EXPECT_EQ(listing(4, 2, 2),
            "[R<0.0] F0.0 [S>0.0] [R<1.0] "
            "F1.0 [S>1.0 R>0.0] B0.0 [S<0.0] "
            "[R>1.0] B1.0 [S<1.0]");
  EXPECT_EQ(listing(4, 3, 2), "[R<0.0] F0.0 B0.0 [S<0.0 R<1.0] F1.0 B1.0 [S<1.0]");
}

// Forward-only 1F1B keeps Megatron's shape (w warm-up forwards, then forwards with send_forward
// and recv_forward as two separate groups); every rank ends up doing [R<] F [S>] per micro-batch.
TEST(PipelineSchedule, OneFOneBForwardOnly) {
  EXPECT_EQ(listing(2, 0, 3, 1, 0, true), "F0.0 [S>0.0] F1.0 [S>1.0] F2.0 [S>2.0]");
  EXPECT_EQ(listing(2, 1, 3, 1, 0, true), "[R<0.0] F0.0 [R<1.0] F1.0 [R<2.0] F2.0");
  EXPECT_EQ(listing(3, 1, 2, 1, 0, true), "[R<0.0] F0.0 [S>0.0] [R<1.0] F1.0 [S>1.0]");
}

// Interleaved, pp = 2, V = 2, M = 4 (N = 2). Table k → (mb, chunk):
//   k    0   1   2   3   4   5   6   7
//   fwd 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1      bwd(k) = (mb, 1 − chunk):
//   bwd 0.1 1.1 0.0 1.0 2.1 3.1 2.0 3.0
// Rank 0 (first): w = 2·1 + 1·2 = 4, R = 4. After forward k it receives the last rank's output
// of forward k − 1 into chunk + 1, unless that was chunk 1 (the loss):
//   k=0: k < pp − 1 → nothing;  k=1: fwd(0) = 0.0 → R<0.1;  k=2: fwd(1) = 1.0 → R<1.1;
//   k=3: fwd(2) = 0.1 → nothing, but it is the last warm-up step: R> for bwd(0) = 0.1.
// Steady k: F(4 + k), B(k), {S> F, S< B unless chunk 0, R< as above for 4 + k, R> bwd(k + 1)}:
//   k=0: F2.0 B0.1, fwd(3) = 1.1 → no R<, R>1.1     k=1: F3.0 B1.1, fwd(4) = 2.0 → R<2.1, R>0.0
//   k=2: F2.1 B0.0 (chunk 0 of rank 0: no S<), fwd(5) = 3.0 → R<3.1, R>1.0
//   k=3: F3.1 B1.0, last step: no R<, R>2.1
// Cool-down k = 4..7: B(k), S< unless chunk 0, R> bwd(k + 1) except after the last.
// Rank 1 (last): w = 0 + 2 = 2, R = 6. It receives fwd(k + 1) after forward k; its chunk 1 is the
// last virtual stage (no S>). After backward k it receives rank 0's input-gradient of backward
// k − 1 into chunk − 1, unless that was chunk 0:
//   k=0: nothing (k < pp − 1); k=1: bwd(0) = 0.1 → R>0.0; k=2: bwd(1) = 1.1 → R>1.0;
//   k=3: bwd(2) = 0.0 → nothing; k=4: bwd(3) = 1.0 → nothing; k=5: bwd(4) = 2.1 → R>2.0;
//   k=6: bwd(5) = 3.1 → R>3.0; k=7: last → nothing.
TEST(PipelineSchedule, InterleavedTwoStagesTwoChunksFourMicroBatches) {
  EXPECT_EQ(listing(2, 0, 4, 2),
            "F0.0 [S>0.0] "
            "F1.0 [S>1.0 R<0.1] "
            "F0.1 [S>0.1 R<1.1] "
            "F1.1 [S>1.1 R>0.1] "
            "F2.0 B0.1 [S>2.0 S<0.1 R>1.1] "
            "F3.0 B1.1 [S>3.0 S<1.1 R<2.1 R>0.0] "
            "F2.1 B0.0 [S>2.1 R<3.1 R>1.0] "
            "F3.1 B1.0 [S>3.1 R>2.1] "
            "B2.1 [S<2.1 R>3.1] "
            "B3.1 [S<3.1 R>2.0] "
            "B2.0 [R>3.0] "
            "B3.0");
  EXPECT_EQ(listing(2, 1, 4, 2),
            "[R<0.0] "
            "F0.0 [S>0.0 R<1.0] "
            "F1.0 [S>1.0 R<0.1] "
            "F0.1 B0.1 [S<0.1 R<1.1] "
            "F1.1 B1.1 [S<1.1 R<2.0 R>0.0] "
            "F2.0 B0.0 [S>2.0 S<0.0 R<3.0 R>1.0] "
            "F3.0 B1.0 [S>3.0 S<1.0 R<2.1] "
            "F2.1 B2.1 [S<2.1 R<3.1] "
            "F3.1 B3.1 [S<3.1 R>2.0] "
            "B2.0 [S<2.0 R>3.0] "
            "B3.0 [S<3.0]");
}

// Forward-only interleaving: all T = 8 forwards are warm-up; receives as above, no gradients.
TEST(PipelineSchedule, InterleavedForwardOnly) {
  EXPECT_EQ(listing(2, 0, 4, 2, 0, true),
            "F0.0 [S>0.0] F1.0 [S>1.0 R<0.1] F0.1 [S>0.1 R<1.1] F1.1 [S>1.1] "
            "F2.0 [S>2.0] F3.0 [S>3.0 R<2.1] F2.1 [S>2.1 R<3.1] F3.1 [S>3.1]");
  EXPECT_EQ(listing(2, 1, 4, 2, 0, true),
            "[R<0.0] F0.0 [S>0.0 R<1.0] F1.0 [S>1.0 R<0.1] F0.1 [R<1.1] F1.1 [R<2.0] "
            "F2.0 [S>2.0 R<3.0] F3.0 [S>3.0 R<2.1] F2.1 [R<3.1] F3.1");
}

// Interleaved, pp = 2, V = 2, N = 3, M = 5. Table (spec):
//   k    0   1   2   3   4   5   6   7   8   9
//   fwd 0.0 1.0 2.0 0.1 1.1 2.1 3.0 4.0 3.1 4.1
//   bwd 0.1 1.1 2.1 0.0 1.0 2.0 3.1 4.1 3.0 4.0
// Rank 0: w = 2 + 3 = 5, R = 5: F(0..4); then F(5 + k) B(k) for k = 0..4; then B(5..9).
// Rank 1: w = 0 + 3 = 3, R = 7: F(0..2); then F(3 + k) B(k) for k = 0..6; then B(7..9).
// Rank 0's receives (first rank: source fwd(k − 1) of the last rank, chunk + 1 unless chunk 1):
//   k=1: 0.0 → R<0.1  k=2: 1.0 → R<1.1  k=3: 2.0 → R<2.1  k=4: 0.1 → none (+ R>0.1 for bwd 0)
//   k=5: 1.1 none  k=6: 2.1 none  k=7: 3.0 → R<3.1  k=8: 4.0 → R<4.1  k=9: last.
TEST(PipelineSchedule, InterleavedGroupOfThreeFiveMicroBatches) {
  const auto r0 = build_schedule(config(2, 0, 5, 2, 3));
  const auto r1 = build_schedule(config(2, 1, 5, 2, 3));
  EXPECT_EQ(compute_order(r0),
            "F0.0 F1.0 F2.0 F0.1 F1.1 "
            "F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F3.1 B0.0 F4.1 B1.0 "
            "B2.0 B3.1 B4.1 B3.0 B4.0");
  EXPECT_EQ(compute_order(r1),
            "F0.0 F1.0 F2.0 "
            "F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.0 B0.0 F4.0 B1.0 F3.1 B2.0 F4.1 B3.1 "
            "B4.1 B3.0 B4.0");
  EXPECT_EQ(format_schedule(r0),
            "F0.0 [S>0.0] F1.0 [S>1.0 R<0.1] F2.0 [S>2.0 R<1.1] F0.1 [S>0.1 R<2.1] "
            "F1.1 [S>1.1 R>0.1] "
            "F2.1 B0.1 [S>2.1 S<0.1 R>1.1] "
            "F3.0 B1.1 [S>3.0 S<1.1 R>2.1] "
            "F4.0 B2.1 [S>4.0 S<2.1 R<3.1 R>0.0] "
            "F3.1 B0.0 [S>3.1 R<4.1 R>1.0] "
            "F4.1 B1.0 [S>4.1 R>2.0] "
            "B2.0 [R>3.1] B3.1 [S<3.1 R>4.1] B4.1 [S<4.1 R>3.0] B3.0 [R>4.0] B4.0");
}

// All warm-up in training (pp = 4, V = 2, M = 4: rank 0 wants 10 > T = 8 warm-up forwards): after
// the last forward the rank receives the gradient for backward 0 alone (Megatron's recv_backward
// before the cool-down), then runs all backwards.
TEST(PipelineSchedule, InterleavedAllWarmupReceivesTheFirstGradientAlone) {
  const auto r0 = build_schedule(config(4, 0, 4, 2));
  EXPECT_EQ(compute_order(r0), "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 B0.1 B1.1 B2.1 B3.1 B0.0 B1.0 B2.0 B3.0");
  EXPECT_NE(format_schedule(r0).find("F3.1 [S>3.1] [R>0.1] B0.1"), std::string::npos) << format_schedule(r0);
  // The last rank never receives a gradient for its last chunk.
  const auto r3 = build_schedule(config(4, 3, 4, 2));
  EXPECT_EQ(format_schedule(r3).find("R>0.1"), std::string::npos) << format_schedule(r3);
}

// Golden lists from Megatron's own code: MegaDLMs' forward_backward_pipelining_without_interleaving
// and _with_interleaving executed with recorders in place of torch, the p2p calls and the model
// (tests/golden/pipeline_schedules.py, command in the .inc header): every valid configuration with
// pp = 2..4, V = 1..3, M = 1..8, every valid N, forward-only on and off — 600 rank lists. Compute
// order, group boundaries and the (micro-batch, chunk) of every transfer must agree; inside a group
// the golden lists use our posting order (schedule.h says why it differs from Megatron's).
namespace {
struct GoldenSchedule {
  int pp, m, v, n, forward_only, rank;
  const char* list;
};
const GoldenSchedule kMegatronSchedules[] = {
#include "golden/pipeline_schedules_megadlms.inc"
};
}  // namespace

TEST(PipelineSchedule, MatchesMegatronsOwnSchedules) {
  int compared = 0;
  for (const GoldenSchedule& g : kMegatronSchedules) {
    EXPECT_EQ(listing(g.pp, g.rank, g.m, g.v, g.n, g.forward_only != 0), g.list)
        << "pp=" << g.pp << " rank=" << g.rank << " M=" << g.m << " V=" << g.v << " N=" << g.n
        << " forward_only=" << g.forward_only;
    ++compared;
  }
  EXPECT_EQ(compared, 600);
}

TEST(PipelineSchedule, FormatsActions) {
  Action f;
  f.type = ActionType::Forward;
  f.micro_batch = 12;
  f.chunk = 3;
  Action c;
  c.type = ActionType::Communicate;
  c.transfers = {{Transfer::Kind::SendNext, 0, 0}, {Transfer::Kind::SendPrev, 1, 2},
                 {Transfer::Kind::RecvPrev, 1, 0}, {Transfer::Kind::RecvNext, 3, 1}};
  Action b = f;
  b.type = ActionType::Backward;
  EXPECT_EQ(format_action(f), "F12.3");
  EXPECT_EQ(format_action(c), "[S>0.0 S<1.2 R<1.0 R>3.1]");
  EXPECT_EQ(format_schedule({f, c, b}), "F12.3 [S>0.0 S<1.2 R<1.0 R>3.1] B12.3");
  EXPECT_EQ(format_schedule({}), "");
}

// Structural facts every list has, for all sizes: groups are never empty, transfers are in
// posting order, the pipeline ends carry no open-side transfer.
TEST(PipelineSchedule, ListsHaveNoEmptyGroupsAndNoOpenSideTransfers) {
  for (int pp = 2; pp <= 5; ++pp)
    for (int v = 1; v <= 3; ++v)
      for (int m = pp; m <= 2 * pp; m += pp)
        for (int r = 0; r < pp; ++r) {
          const auto list = build_schedule(config(pp, r, m, v));
          for (const Action& a : list) {
            if (a.type != ActionType::Communicate) continue;
            ASSERT_FALSE(a.transfers.empty());
            for (size_t i = 1; i < a.transfers.size(); ++i)
              EXPECT_NE(a.transfers[i - 1].kind, a.transfers[i].kind) << format_action(a);
            for (const Transfer& t : a.transfers) {
              const int stage = t.chunk * pp + r;
              if (t.kind == Transfer::Kind::RecvPrev || t.kind == Transfer::Kind::SendPrev) {
                EXPECT_NE(stage, 0) << format_action(a);
              } else {
                EXPECT_NE(stage, v * pp - 1) << format_action(a);
              }
            }
          }
        }
}

// ---------------------------------------------------------------------------- simulator: sweep

// Every valid configuration up to pp = 8, V = 4, M = 24, every valid N (default and explicit),
// forward-only on and off: the lists run to completion, consistently; the peak of (mb, chunk)
// pairs held for backward on some rank is exactly max over r of w_r + 1 (w_r when the rank has no
// steady state); and the idealized run takes exactly the work plus the fill/drain bubble.
TEST(PipelineSimulator, AcceptsEveryValidConfiguration) {
  int simulated = 0;
  for (int pp = 1; pp <= 8; ++pp)
    for (int v = 1; v <= 4; ++v) {
      if (pp == 1 && v > 1) continue;
      for (int m = 1; m <= 24; ++m) {
        std::vector<int> groups{0};
        if (v > 1)
          for (int n = pp; n <= m; ++n) groups.push_back(n);
        for (int n : groups)
          for (bool forward_only : {false, true}) {
            const ScheduleConfig c0 = config(pp, 0, m, v, n, forward_only);
            if (v > 1) {
              const int nn = microbatch_group_size(c0);
              const bool r1 = pp <= nn && nn <= m && (m % nn == 0 || m % nn >= pp);
              if (!r1) {
                EXPECT_THROW(build_schedule(c0), Error) << pp << " " << v << " " << m << " " << n;
                continue;
              }
            }
            const Lists lists = all_ranks(pp, m, v, n, forward_only);
            const SimulationReport rep = simulate(lists, pp, v, m, n);
            ASSERT_TRUE(rep.ok) << "pp=" << pp << " V=" << v << " M=" << m << " N=" << n
                                << " forward_only=" << forward_only << ": " << rep.error;
            EXPECT_EQ(rep.forward_only, forward_only);
            int peak = 0;
            if (!forward_only)
              for (int r = 0; r < pp; ++r) {
                const int w = warmup_micro_batches(config(pp, r, m, v, n));
                peak = std::max(peak, w < m * v ? w + 1 : w);
              }
            EXPECT_EQ(rep.max_in_flight_per_rank, peak) << pp << " " << v << " " << m << " " << n;
            // No bubble beyond the pipeline's fill and drain: (pp − 1) forward and (pp − 1)
            // backward units on top of the 2·M·V units of work of one rank.
            EXPECT_EQ(rep.idealized_time, forward_only ? m * v + pp - 1 : 2 * m * v + 2 * (pp - 1))
                << pp << " " << v << " " << m << " " << n << " " << forward_only;
            // Receive buffers: one waiting tensor per direction, except where the ring wraps
            // around with N > pp — rank 0's inputs and the last rank's gradients pile up to
            // N − pp + 1 (Megatron sizes its overlapped receive buffers the same way).
            for (int r = 0; r < pp; ++r) {
              const int wrap = v > 1 ? microbatch_group_size(c0) - pp + 1 : 0;
              EXPECT_EQ(max_waiting(lists[r], Transfer::Kind::RecvPrev), r == 0 ? wrap : 1)
                  << pp << " " << v << " " << m << " " << n << " rank " << r;
              EXPECT_EQ(max_waiting(lists[r], Transfer::Kind::RecvNext),
                        forward_only ? 0 : (r == pp - 1 ? wrap : 1))
                  << pp << " " << v << " " << m << " " << n << " rank " << r;
            }
            ++simulated;
          }
      }
    }
  EXPECT_EQ(simulated, 5412);  // 48 with pp = 1, 5364 with pp = 2..8
}

// The idealized runs drawn in docs/parallelism/pipeline_schedules.md (one unit per Forward or
// Backward of one chunk): 1F1B pp = 2, M = 4 takes 8 units of work + 2 of bubble; interleaving
// the same pipeline in V = 2 chunks halves the unit, so 16 + 2 — bubble (pp − 1)/(M·V) = 1/8.
TEST(PipelineSimulator, IdealizedTimesOfTheDocExamples) {
  EXPECT_EQ(simulate(all_ranks(2, 4), 2, 1, 4).idealized_time, 10);
  EXPECT_EQ(simulate(all_ranks(2, 4, 2), 2, 2, 4).idealized_time, 18);
  EXPECT_EQ(simulate(all_ranks(4, 8), 4, 1, 8).idealized_time, 22);
  EXPECT_EQ(simulate(all_ranks(4, 8, 2), 4, 2, 8).idealized_time, 38);
  EXPECT_EQ(simulate(all_ranks(1, 4), 1, 1, 4).idealized_time, 8);
}

// ---------------------------------------------------------------------------- simulator: bugs

TEST(PipelineSimulator, CatchesAMissingReceive) {
  // 1F1B pp = 4, M = 4, rank 2 without its standalone [R<1.0] (the receive before the steady state).
  Lists lists = all_ranks(4, 4);
  auto& r2 = lists[2];
  auto it = std::find_if(r2.begin(), r2.end(), [](const Action& a) { return format_action(a) == "[R<1.0]"; });
  ASSERT_NE(it, r2.end());
  r2.erase(it);
  const auto rep = simulate(lists, 4, 1, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("rank 2"), std::string::npos) << rep.error;
  EXPECT_NE(rep.error.find("F1.0"), std::string::npos) << rep.error;
  EXPECT_NE(rep.error.find("before its input arrived"), std::string::npos) << rep.error;

  // Interleaved pp = 2, V = 2, M = 4: drop R<2.1 from rank 0's 4-transfer group. Rank 1's S>2.0
  // (which wraps to rank 0's chunk 1) now meets the next receive on channel 1 -> 0, R>0.0.
  Lists il = all_ranks(2, 4, 2);
  for (auto& a : il[0])
    if (format_action(a) == "[S>3.0 S<1.1 R<2.1 R>0.0]") a.transfers.erase(a.transfers.begin() + 2);
  const auto rep2 = simulate(il, 2, 2, 4);
  EXPECT_FALSE(rep2.ok);
  EXPECT_NE(rep2.error.find("mismatch on channel rank 1 -> rank 0"), std::string::npos) << rep2.error;
}

// Exhaustive single deletions: removing any one transfer or any one compute action from any
// rank's list is reported, for a 1F1B and two interleaved configurations (one with N > pp).
TEST(PipelineSimulator, CatchesEverySingleDeletion) {
  struct Case {
    int pp, m, v, n;
  };
  for (const Case& k : {Case{4, 6, 1, 0}, Case{2, 4, 2, 0}, Case{3, 7, 3, 4}}) {
    const Lists good = all_ranks(k.pp, k.m, k.v, k.n);
    ASSERT_TRUE(simulate(good, k.pp, k.v, k.m, k.n).ok);
    int mutants = 0;
    for (int r = 0; r < k.pp; ++r)
      for (size_t i = 0; i < good[r].size(); ++i) {
        const size_t n_transfers = good[r][i].transfers.size();
        for (size_t j = 0; j < std::max<size_t>(n_transfers, 1); ++j) {
          Lists bad = good;
          if (n_transfers <= 1)
            bad[r].erase(bad[r].begin() + static_cast<long>(i));
          else
            bad[r][i].transfers.erase(bad[r][i].transfers.begin() + static_cast<long>(j));
          const auto rep = simulate(bad, k.pp, k.v, k.m, k.n);
          EXPECT_FALSE(rep.ok) << "pp=" << k.pp << " V=" << k.v << ": deleting from rank " << r
                               << " action " << i << " (" << format_action(good[r][i]) << ") went unnoticed";
          ++mutants;
        }
      }
    EXPECT_GT(mutants, 50);
  }
}

TEST(PipelineSimulator, CatchesCommunicateActionsSwappedBetweenRanks) {
  // 1F1B pp = 4, M = 4: exchange the steady-state group of rank 1 ([S>2.0 R>0.0]) with the
  // corresponding group of rank 2 ([S>1.0 R>0.0]).
  Lists lists = all_ranks(4, 4);
  auto find = [](std::vector<Action>& l, const std::string& text) {
    return std::find_if(l.begin(), l.end(), [&](const Action& a) { return format_action(a) == text; });
  };
  auto a1 = find(lists[1], "[S>2.0 R>0.0]");
  auto a2 = find(lists[2], "[S>1.0 R>0.0]");
  ASSERT_NE(a1, lists[1].end());
  ASSERT_NE(a2, lists[2].end());
  std::swap(*a1, *a2);
  const auto rep = simulate(lists, 4, 1, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_FALSE(rep.error.empty());

  // Every exchange of the i-th Communicate of two neighbouring ranks that changes either list
  // is caught (interleaved pp = 3, V = 2, M = 6).
  const Lists good = all_ranks(3, 6, 2);
  int swaps = 0;
  for (int r = 0; r + 1 < 3; ++r) {
    const auto ia = communicate_indices(good[r]), ib = communicate_indices(good[r + 1]);
    for (size_t i = 0; i < std::min(ia.size(), ib.size()); ++i) {
      if (good[r][ia[i]] == good[r + 1][ib[i]]) continue;
      Lists bad = good;
      std::swap(bad[r][ia[i]], bad[r + 1][ib[i]]);
      EXPECT_FALSE(simulate(bad, 3, 2, 6).ok) << "ranks " << r << "/" << r + 1 << " group " << i;
      ++swaps;
    }
  }
  EXPECT_GT(swaps, 20);
}

TEST(PipelineSimulator, CatchesCommunicateActionsSwappedWithinARank) {
  // Interleaved pp = 2, V = 2, M = 4, rank 1: post the group of steady step 3 before that of
  // steady step 2. Its S>3.0 would leave before F3.0 ran.
  Lists lists = all_ranks(2, 4, 2);
  const auto idx = communicate_indices(lists[1]);
  const auto at = [&](const std::string& t) {
    return *std::find_if(idx.begin(), idx.end(), [&](size_t i) { return format_action(lists[1][i]) == t; });
  };
  std::swap(lists[1][at("[S>2.0 S<0.0 R<3.0 R>1.0]")], lists[1][at("[S>3.0 S<1.0 R<2.1]")]);
  const auto rep = simulate(lists, 2, 2, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("before its forward"), std::string::npos) << rep.error;

  // Cool-down of rank 0, 1F1B pp = 4, M = 2: receiving mb 1's gradient before mb 0's leaves B0.0
  // without its gradient (and crosses the FIFO order on channel 1 -> 0).
  Lists c = all_ranks(4, 2);
  std::swap(c[0][4], c[0][6]);  // "... [R>0.0] B0.0 [R>1.0] B1.0" → "[R>1.0] B0.0 [R>0.0] B1.0"
  ASSERT_EQ(format_schedule(c[0]), "F0.0 [S>0.0] F1.0 [S>1.0] [R>1.0] B0.0 [R>0.0] B1.0");
  const auto rep2 = simulate(c, 4, 1, 2);
  EXPECT_FALSE(rep2.ok);
  EXPECT_NE(rep2.error.find("mismatch on channel rank 1 -> rank 0"), std::string::npos) << rep2.error;
}

TEST(PipelineSimulator, CatchesABackwardMovedBeforeItsForward) {
  // 1F1B pp = 4, M = 4, rank 3: "F0.0 B0.0" → "B0.0 F0.0".
  Lists lists = all_ranks(4, 4);
  std::swap(lists[3][1], lists[3][2]);
  ASSERT_EQ(format_action(lists[3][1]), "B0.0");
  const auto rep = simulate(lists, 4, 1, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("rank 3, action 1 (B0.0): backward before its forward"), std::string::npos) << rep.error;

  // Interleaved pp = 4, V = 2, M = 8: on every rank, moving the first Backward to just before its
  // own Forward is reported.
  const Lists good = all_ranks(4, 8, 2);
  for (int r = 0; r < 4; ++r) {
    Lists bad = good;
    auto& l = bad[r];
    auto b = std::find_if(l.begin(), l.end(), [](const Action& a) { return a.type == ActionType::Backward; });
    const Action moved = *b;
    l.erase(b);
    auto f = std::find_if(l.begin(), l.end(), [&](const Action& a) {
      return a.type == ActionType::Forward && a.micro_batch == moved.micro_batch && a.chunk == moved.chunk;
    });
    l.insert(f, moved);
    const auto r2 = simulate(bad, 4, 2, 8);
    EXPECT_FALSE(r2.ok) << "rank " << r;
    EXPECT_NE(r2.error.find("backward before its forward"), std::string::npos) << r2.error;
  }
}

// Un-batching the paired calls of the steady state into receive-first singles on both sides is
// the classic pipeline deadlock: rank 0 waits for a gradient, rank 1 for an activation.
TEST(PipelineSimulator, CatchesADeadlock) {
  Lists lists = all_ranks(2, 4);
  auto split_receive_first = [](std::vector<Action>& l, const std::string& text) {
    auto it = std::find_if(l.begin(), l.end(), [&](const Action& a) { return format_action(a) == text; });
    ASSERT_NE(it, l.end());
    Action recv = *it, send = *it;
    recv.transfers = {it->transfers[1]};
    send.transfers = {it->transfers[0]};
    *it = send;
    l.insert(it, recv);
  };
  split_receive_first(lists[0], "[S>1.0 R>0.0]");
  split_receive_first(lists[1], "[S<0.0 R<1.0]");
  const auto rep = simulate(lists, 2, 1, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("deadlock"), std::string::npos) << rep.error;
  EXPECT_NE(rep.error.find("waits for R>0.0"), std::string::npos) << rep.error;
  EXPECT_NE(rep.error.find("waits for R<1.0"), std::string::npos) << rep.error;
}

// GPipe (all forwards, then all backwards) is consistent and deadlock-free, but holds M
// activations: the in-flight bound of warm-up + 1 is what rejects it.
TEST(PipelineSimulator, CatchesTooManyMicroBatchesInFlight) {
  Lists gpipe(2);
  auto act = [](ActionType t, int mb) { Action a; a.type = t; a.micro_batch = mb; a.chunk = 0; return a; };
  auto comm = [](Transfer::Kind k, int mb) { Action a; a.type = ActionType::Communicate; a.transfers = {{k, mb, 0}}; return a; };
  for (int mb = 0; mb < 4; ++mb) {
    gpipe[0].push_back(act(ActionType::Forward, mb));
    gpipe[0].push_back(comm(Transfer::Kind::SendNext, mb));
    gpipe[1].push_back(comm(Transfer::Kind::RecvPrev, mb));
    gpipe[1].push_back(act(ActionType::Forward, mb));
  }
  for (int mb = 0; mb < 4; ++mb) {
    gpipe[0].push_back(comm(Transfer::Kind::RecvNext, mb));
    gpipe[0].push_back(act(ActionType::Backward, mb));
    gpipe[1].push_back(act(ActionType::Backward, mb));
    gpipe[1].push_back(comm(Transfer::Kind::SendPrev, mb));
  }
  const auto rep = simulate(gpipe, 2, 1, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("above warm-up + 1 = 2"), std::string::npos) << rep.error;
}

// Transfers on the open side of the pipeline, gradients in a forward-only run, duplicates and
// empty groups are reported by name.
TEST(PipelineSimulator, CatchesMalformedActions) {
  auto expect_error = [](Lists lists, int pp, int v, int m, const std::string& what) {
    const auto rep = simulate(lists, pp, v, m);
    EXPECT_FALSE(rep.ok);
    EXPECT_NE(rep.error.find(what), std::string::npos) << rep.error;
  };
  {
    Lists l = all_ranks(2, 2);
    l[0].insert(l[0].begin(), Action{ActionType::Communicate, -1, -1, {{Transfer::Kind::RecvPrev, 0, 0}}});
    expect_error(l, 2, 1, 2, "the first virtual stage receives no activation");
  }
  {
    Lists l = all_ranks(2, 2);
    l[1].push_back(Action{ActionType::Communicate, -1, -1, {{Transfer::Kind::SendNext, 1, 0}}});
    expect_error(l, 2, 1, 2, "the last virtual stage sends no activation");
  }
  {
    Lists l = all_ranks(2, 2);
    l[1].push_back(Action{ActionType::Communicate, -1, -1, {}});
    expect_error(l, 2, 1, 2, "empty Communicate action");
  }
  {
    Lists l = all_ranks(2, 2, 1, 0, true);
    l[0].push_back(Action{ActionType::Communicate, -1, -1, {{Transfer::Kind::RecvNext, 0, 0}}});
    expect_error(l, 2, 1, 2, "gradient transfer in a forward-only run");
  }
  {
    Lists l = all_ranks(2, 2);
    l[0].push_back(Action{ActionType::Forward, 1, 0, {}});
    expect_error(l, 2, 1, 2, "forwarded twice");
  }
  {
    Lists l = all_ranks(2, 2);
    l[0].push_back(Action{ActionType::Forward, 2, 0, {}});
    expect_error(l, 2, 1, 2, "out of range");
  }
  {
    Lists l = all_ranks(2, 3);  // rank 1 never backwards mb 2
    l[1].erase(l[1].end() - 2);
    expect_error(l, 2, 1, 3, "input-gradient before its backward");
  }
  EXPECT_THROW(simulate(all_ranks(2, 2), 3, 1, 2), Error);
}

// Why the posting order inside a group matters (docs/rules.md#V-19): with pp = 2 both
// neighbours are one rank, and a group can carry an activation and a gradient over the same pair.
// Megatron's order (send_prev, recv_prev, send_next, recv_next) posts the gradient first on the
// sending side and the activation first on the receiving side, so FIFO matching pairs a gradient
// with an activation; Megatron therefore demands pp > 2 for its batched interleaved schedule. Our
// order (activation pair first) is consistent; for pp > 2 every pair carries one direction only and
// both orders work.
TEST(PipelineSimulator, MegatronPostingOrderOnlyFailsWithTwoStages) {
  Lists two = all_ranks(2, 4, 2);
  ASSERT_TRUE(simulate(two, 2, 2, 4).ok);
  use_megatron_posting_order(two);
  const auto rep = simulate(two, 2, 2, 4);
  EXPECT_FALSE(rep.ok);
  EXPECT_NE(rep.error.find("mismatch on channel"), std::string::npos) << rep.error;

  for (int pp = 3; pp <= 6; ++pp) {
    Lists lists = all_ranks(pp, 2 * pp, 3);
    use_megatron_posting_order(lists);
    const auto r = simulate(lists, pp, 3, 2 * pp);
    EXPECT_TRUE(r.ok) << pp << ": " << r.error;
  }
  // 1F1B never sends both directions to one peer in one group (its pairs are send-next with
  // receive-next, or send-prev with receive-prev), so pp = 2 works with either order.
  Lists one = all_ranks(2, 6);
  use_megatron_posting_order(one);
  EXPECT_TRUE(simulate(one, 2, 1, 6).ok);
}

// The simulator checks consistency, not identity with Megatron (the exact-list tests pin that):
// reordering two independent groups that stays deadlock-free is accepted.
TEST(PipelineSimulator, AcceptsAnEquivalentReordering) {
  Lists lists = all_ranks(4, 4);
  // Rank 1: "[R<0.0] F0.0 [S>0.0] [R<1.0] F1.0" → "[R<0.0] F0.0 [R<1.0] [S>0.0] F1.0".
  std::swap(lists[1][2], lists[1][3]);
  ASSERT_EQ(format_action(lists[1][2]), "[R<1.0]");
  const auto rep = simulate(lists, 4, 1, 4);
  EXPECT_TRUE(rep.ok) << rep.error;
}

// ---------------------------------------------------------------------------- validate()

TEST(PipelineScheduleValidate, NamesR1WhenTheRemainderLeavesABubble) {
  // pp = 4, V = 2, M = 6, default N = 4: 6 % 4 = 2 < 4.
  const std::string e = validation_error(config(4, 0, 6, 2));
  EXPECT_NE(e.find("R-1"), std::string::npos) << e;
  EXPECT_NE(e.find("pp=4, N=4 (default N = pp), M=6"), std::string::npos) << e;
  EXPECT_NE(e.find("M % N = 2 is neither 0 nor >= pp"), std::string::npos) << e;
  EXPECT_NE(e.find("Valid N for pp=4, M=6: 6."), std::string::npos) << e;
  EXPECT_NE(e.find("Valid M near 6 for pp=4, N=4: 4, 8, 12"), std::string::npos) << e;
  EXPECT_THROW(build_schedule(config(4, 0, 6, 2)), Error);
  EXPECT_THROW(warmup_micro_batches(config(4, 0, 6, 2)), Error);
}

TEST(PipelineScheduleValidate, NamesR1WhenTheGroupIsOutOfRange) {
  // N < pp: pp = 4, N = 3, M = 8. Valid N for M = 8: 4 (8 % 4 = 0) and 8; 5, 6, 7 leave 3, 2, 1.
  std::string e = validation_error(config(4, 2, 8, 2, 3));
  EXPECT_NE(e.find("N < pp"), std::string::npos) << e;
  EXPECT_NE(e.find("Valid N for pp=4, M=8: 4, 8"), std::string::npos) << e;
  // N > M (the default N = pp with fewer micro-batches than stages): none valid.
  e = validation_error(config(4, 0, 2, 2));
  EXPECT_NE(e.find("N > M"), std::string::npos) << e;
  EXPECT_NE(e.find("none (at least pp=4 micro-batches are needed)"), std::string::npos) << e;
  // An explicit N with a good remainder: pp = 2, N = 3, M = 5 (5 % 3 = 2 >= 2) is valid;
  // M = 7 (7 % 3 = 1) is not, and M = 8 would be.
  EXPECT_EQ(validation_error(config(2, 0, 5, 2, 3)), "");
  e = validation_error(config(2, 0, 7, 2, 3));
  EXPECT_NE(e.find("M % N = 1"), std::string::npos) << e;
  EXPECT_NE(e.find("Valid M near 7 for pp=2, N=3: 3, 5, 6, 8, 9, 11, 12"), std::string::npos) << e;
  EXPECT_NE(e.find("Valid N for pp=2, M=7: 4, 5, 7"), std::string::npos) << e;
}

TEST(PipelineScheduleValidate, ReportsEveryProblemAtOnce) {
  std::string e = validation_error(config(4, 4, 0, 0, -1));
  EXPECT_NE(e.find("pp_rank=4 must be in [0, 3] for pp_size=4"), std::string::npos) << e;
  EXPECT_NE(e.find("virtual_stages=0 must be >= 1"), std::string::npos) << e;
  EXPECT_NE(e.find("num_micro_batches=0 must be >= 1"), std::string::npos) << e;
  EXPECT_NE(e.find("microbatch_group_size=-1 must be >= 0"), std::string::npos) << e;
  e = validation_error(config(1, 0, 4, 2));
  EXPECT_NE(e.find("virtual_stages=2 needs pp_size > 1"), std::string::npos) << e;
  EXPECT_NE(validation_error(config(0, 0, 4)).find("pp_size=0 must be >= 1"), std::string::npos);
  // V = 1 ignores N; 1F1B takes any M.
  EXPECT_EQ(validation_error(config(4, 0, 3, 1, 7)), "");
  EXPECT_EQ(validation_error(config(8, 7, 1)), "");
}
