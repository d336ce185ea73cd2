// The pieces of the optimizer gradients that a gradient norm sums, grouped into runs: one
// ops::sum_squares per run instead of one per parameter piece. A fine-grained MoE has thousands
// of pieces (64 experts x 3 weights x 12 layers); summed piece by piece, the norm was two
// kernels per piece (32 ms of a 170 ms step on an H200). Pieces that touch and go into the same
// accumulator cover the same elements as one range, so a run changes only the summation order.
// Used by DataParallel and FullyShardedDataParallel (grad_sq_norm).
#pragma once
#include <cstdint>
#include <vector>

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

}  // namespace megadlm
