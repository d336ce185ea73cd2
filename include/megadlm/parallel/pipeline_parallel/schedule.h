// Pipeline schedules as data: a pure function from (pp rank, pp size, virtual stages V,
// micro-batches M) to the ordered list of compute and batched-p2p actions that rank runs, plus
// a simulator that runs all ranks' lists together and proves them consistent and deadlock-free.
// Owns the order only; running the actions (tensors, streams, communicators) is executor.h's job.
// Algorithm, worked examples and the simulator's definition of correctness:
// docs/parallelism/pipeline_schedules.md (with Megatron's schedules).
//
// Vocabulary. Rank r holds V model chunks; chunk c of rank r is virtual stage v = c·pp + r, so
// the model runs through virtual stages 0, 1, …, V·pp − 1. The forward output of chunk c goes to
// the next rank in the ring ((r + 1) % pp); from the last rank it enters chunk c + 1 of rank 0.
// Gradients travel the other way (from rank 0's chunk c they enter chunk c − 1 of the last rank).
// The first virtual stage (rank 0, chunk 0) reads data; the last (rank pp − 1, chunk V − 1)
// computes the loss: those two never receive / send the activation (resp. its gradient) on the
// open side, and the schedules simply contain no such transfer.
//
// Worked example, 1F1B with pp = 2, M = 4 (the rest in the doc):
//   rank 0: F0.0 [S>0.0] F1.0 [S>1.0 R>0.0] B0.0 F2.0 [S>2.0 R>1.0] B1.0 F3.0 [S>3.0 R>2.0] B2.0
//           [R>3.0] B3.0
//   rank 1: [R<0.0] F0.0 B0.0 [S<0.0 R<1.0] F1.0 B1.0 [S<1.0 R<2.0] F2.0 B2.0 [S<2.0 R<3.0] F3.0
//           B3.0 [S<3.0]
// "F2.0" is Forward(micro-batch 2, chunk 0); a bracket is one Communicate action; "S>" send to
// next, "R<" receive from prev, "S<" send to prev, "R>" receive from next.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megadlm::pp {

enum class ActionType : uint8_t { Forward, Backward, Communicate };

/// One side of a point-to-point transfer. Peers: next = (pp_rank + 1) % pp, prev = (pp_rank −
/// 1 + pp) % pp. `chunk` always names a chunk of THIS rank:
///   SendNext: the output of my chunk `chunk`        (peer's chunk: chunk, or chunk + 1 from the last rank)
///   RecvPrev: the input of my chunk `chunk`
///   SendPrev: the input-gradient of my chunk `chunk` (peer's chunk: chunk, or chunk − 1 from rank 0)
///   RecvNext: the output-gradient of my chunk `chunk`
struct Transfer {
  enum class Kind : uint8_t { SendNext, RecvPrev, SendPrev, RecvNext };
  Kind kind = Kind::SendNext;
  int micro_batch = -1;  ///< whose tensor, in [0, M)
  int chunk = -1;        ///< in [0, V), see above
  bool operator==(const Transfer&) const = default;
};

/// Forward / Backward: run chunk `chunk` on micro-batch `micro_batch`. Communicate: post every
/// transfer of `transfers` as ONE batched p2p group (Megatron's batch_p2p_comm) and wait for all
/// of them before the next action. Transfers are listed in the order they must be posted:
/// SendNext, SendPrev, RecvPrev, RecvNext. With pp = 2 both neighbours are the same rank and a
/// group may carry an activation and a gradient over the same pair; transfers between one pair
/// match in posting order (comm::Communicator::batch_p2p), and this order puts the activation
/// first on both sides. (Megatron posts send_prev, recv_prev, send_next, recv_next, which would
/// pair a gradient with an activation at pp = 2 — why its batched interleaved schedule demands
/// pp > 2, docs/rules.md#V-19. Only the order inside a group differs from Megatron.)
/// A Communicate action is never empty.
struct Action {
  ActionType type = ActionType::Forward;
  int micro_batch = -1, chunk = -1;  ///< Forward / Backward only (−1 for Communicate)
  std::vector<Transfer> transfers;   ///< Communicate only
  bool operator==(const Action&) const = default;
};

struct ScheduleConfig {
  int pp_rank = 0, pp_size = 1;
  int virtual_stages = 1;         ///< V, model chunks per rank
  int num_micro_batches = 1;      ///< M, per pipeline per step
  int microbatch_group_size = 0;  ///< N for interleaving; 0 = pp_size (Megatron's default); ignored when V = 1
  bool forward_only = false;      ///< evaluation: forwards only, no backward, no gradient transfers
};

/// Megatron's get_forward_backward_func: pp = 1 → NoPipelining; V = 1 → OneFOneB; else Interleaved.
enum class ScheduleKind : uint8_t { NoPipelining, OneFOneB, Interleaved };
ScheduleKind schedule_kind(const ScheduleConfig& config);

/// Throws megadlm::Error listing every problem at once, each with the values and what would be
/// valid: ranges (pp ≥ 1, 0 ≤ pp_rank < pp, V ≥ 1, M ≥ 1, N ≥ 0), V > 1 needs pp > 1, and for
/// interleaving requirement R-1: pp ≤ N ≤ M and (M % N == 0 or M % N ≥ pp).
void validate(const ScheduleConfig& config);

/// The microbatch group size the interleaved schedule uses: N, or pp when N = 0.
int microbatch_group_size(const ScheduleConfig& config);

/// Interleaved forward order (Megatron's schedule table): for each group of N micro-batches
/// [g, g + N) — the last group also takes the remainder, up to M — every chunk c = 0..V−1 in turn
/// runs the whole group. Entry k is (micro-batch, chunk) of forward virtual micro-batch k; the
/// backward of virtual micro-batch k is (same micro-batch, V − 1 − chunk). M·V entries (V = 1: the
/// micro-batches in order). Validates.
/// pp = 2, V = 2, N = 3, M = 5 → mb 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1.
struct VirtualMicroBatch {
  int micro_batch = 0, chunk = 0;
  bool operator==(const VirtualMicroBatch&) const = default;
};
std::vector<VirtualMicroBatch> schedule_table(const ScheduleConfig& config);

/// Warm-up forwards as Megatron counts them (validates):
///   NoPipelining: 0;
///   OneFOneB:     min(pp − r − 1, M)                       (also when forward_only);
///   Interleaved:  min(2·(pp − r − 1) + (V − 1)·N, M·V) virtual micro-batches; M·V when forward_only.
int warmup_micro_batches(const ScheduleConfig& config);

/// The ordered action list of rank config.pp_rank (validates). Deterministic and pure.
std::vector<Action> build_schedule(const ScheduleConfig& config);

/// "F0.0", "B1.0" (micro-batch.chunk) or "[S>0.0 R<1.0]" for a Communicate action.
std::string format_action(const Action& action);
/// The actions of one list separated by spaces, e.g. "F0.0 [S>0.0 R<1.0] B0.0".
std::string format_schedule(const std::vector<Action>& actions);

/// What simulate() found. `error` is empty when ok; otherwise it names the rank, the action
/// (index and text) and the rule that failed, or, for a deadlock, what every stuck rank waits on.
struct SimulationReport {
  bool ok = false;
  std::string error;
  int max_in_flight_per_rank = 0;  ///< max over ranks of (mb, chunk) forwarded but not yet
                                   ///< backwarded; 0 for forward-only lists
  bool forward_only = false;       ///< inferred: no rank has any Backward action
  /// Makespan of an idealized run: every Forward and Backward takes one time unit, transfers take
  /// none, and a Communicate completes when the last peer of its transfers has posted. The valid
  /// schedules reach 2·M·V + 2·(pp − 1) (forward-only: M·V + pp − 1), i.e. a bubble fraction of
  /// (pp − 1)/(M·V); docs/parallelism/pipeline_schedules.md draws these runs.
  int idealized_time = 0;
};

/// Runs every rank's list together (per_rank[r] is pp rank r's list) with blocking batched-p2p
/// semantics: compute actions run at once; a Communicate action posts all its transfers, in list
/// order, and completes when each of them has been matched. Everything one rank sends to another
/// (activations and gradients alike) forms one FIFO channel per ordered pair (src, dst), as in
/// comm::Communicator; the i-th send on a channel meets the i-th receive. Checks:
///   * matched transfers agree: SendNext meets RecvPrev, SendPrev meets RecvNext, the same
///     micro-batch, and the receiver's chunk is the sender's (±1 at the ring wrap-around);
///   * no transfer on the open side of the first / last virtual stage, none empty or out of
///     range, no gradient transfer in a forward-only run, no tensor sent or received twice;
///   * no deadlock: every rank reaches the end of its list;
///   * every Forward of a non-first virtual stage comes after its RecvPrev completed; every
///     Backward after its Forward and (unless the last virtual stage) its RecvNext; every SendNext
///     after its Forward, every SendPrev after its Backward;
///   * every (mb, chunk) forwarded exactly once per rank, and backwarded exactly once unless the
///     run is forward-only (inferred: no rank has a Backward);
///   * (mb, chunk) pairs forwarded but not yet backwarded on rank r never exceed
///     warmup_micro_batches(r) + 1, computed with `microbatch_group_size` (0 = pp).
/// Never throws for a bad list (that is a report with ok = false); throws megadlm::Error only
/// when per_rank.size() != pp_size or a size is < 1.
SimulationReport simulate(const std::vector<std::vector<Action>>& per_rank, int pp_size,
                          int virtual_stages, int num_micro_batches, int microbatch_group_size = 0);

}  // namespace megadlm::pp
