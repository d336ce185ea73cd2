// The pieces of the optimizer gradients that a gradient norm sums, grouped into runs: one
// ops::sum_squares per run instead of one per parameter piece. A fine-grained MoE has thousands
// of pieces (64 experts x 3 weights x 12 layers); summed piece by piece, the norm was two
// kernels per piece (32 ms of a 170 ms step on an H200). Pieces that touch and go into the same
// accumulator cover the same elements as one range, so a run changes only the summation order.
// Also the part of a gradient norm that DataParallel and FullyShardedDataParallel share
// (grad_sq_norm): which of four sums a parameter's pieces go into, the sums themselves, and the
// one-number all-reduce that makes them global. Which groups each wrapper reduces over stays
// with the wrapper, since that is where its sharding rules live.
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/parameter_store.h"

namespace megadlm {

/// Elements [offset, offset + count) of the optimizer gradients, summed into accumulator
/// `target` (the caller's numbering: split / replicated, dense / expert).
struct NormPiece {
  int64_t offset = 0;
  int64_t count = 0;
  int target = 0;
};

/// Longest run that merging makes (a single longer piece stays whole): sum_squares keeps one
/// fp32 sum per thread over a fixed grid (ops/cuda/reduce.cu: 1024 x 256 threads), so 2^28
/// elements is at most 1024 terms per thread sum, and the expert gradients of the benchmark
/// (3.6 B elements) take 14 launches instead of one sum of 14 K terms per thread.
inline constexpr int64_t kMaxNormRun = int64_t{1} << 28;

/// The pieces sorted by offset, with each piece that starts exactly where the previous one ends
/// and has the same target merged into it while the run stays within max_run elements. Pieces
/// left out (a tied weight's copy, padding) leave a gap, so a run never covers them; pieces
/// must not overlap; empty ones are dropped.
std::vector<NormPiece> coalesce_norm_pieces(std::vector<NormPiece> pieces, int64_t max_run = kMaxNormRun);

/// The four accumulators of a gradient norm (NormPiece::target): split parameters hold
/// different elements on each (expert-)TP rank; replicated ones hold the same values on every
/// rank of the group and so count on its rank 0 only.
enum NormTarget : int {
  kNormSplit = 0,
  kNormReplicated = 1,
  kNormExpertSplit = 2,
  kNormExpertReplicated = 3,
};

/// Which tensor-parallel groups of more than one rank the norm's caller has.
struct NormTpGroups {
  bool tp = false;         ///< a TP group: dense replicated parameters are replicated over it
  bool expert_tp = false;  ///< an expert-TP group: expert replicated parameters are, over it
};

/// The accumulator of parameter d's pieces. Without a (expert-)TP group a replicated parameter
/// is not replicated over anything, so it counts as split. A tied weight's copy
/// (PipelineShare::Copy) is the caller's to leave out.
int norm_target(const ParamDesc& d, NormTpGroups groups);

/// The sums of squares of the four accumulators on this rank (fp64 from the accumulator).
struct NormSums {
  double split = 0, replicated = 0, expert_split = 0, expert_replicated = 0;
  /// This rank's dense share: replicated parameters count where tp_rank0 (no TP group: true).
  double dense(bool tp_rank0) const { return tp_rank0 ? split + replicated : split; }
  double expert(bool expert_tp_rank0) const {
    return expert_tp_rank0 ? expert_split + expert_replicated : expert_split;
  }
};

/// Sums of squares of grads over the pieces, one ops::sum_squares per coalesced run, into an
/// fp32 accumulator per target (fp64 for fp64 gradients on the CPU); a target no piece names
/// sums to 0. grads is the flat optimizer-gradient buffer the offsets index.
NormSums sum_norm_pieces(const Tensor& grads, std::vector<NormPiece> pieces, const Stream& stream);

/// v summed over c's ranks (one fp64 all-reduce on stream's device, then waits for it); every
/// rank of c must call it.
double sum_over_ranks(comm::Communicator& c, double v, const Stream& stream);

}  // namespace megadlm
