// Token dispatch of expert parallelism (docs/parallelism/expert_parallel.md):
// the routed rows of this rank go to the ranks that hold their experts, come back as expert
// outputs, and are summed with their routing weights. Explicit forward and backward, each
// half with its conjugate:
//
//   dispatch:          x [T, H] ── permute (expert-major) ── [EP] ── [expert TP] ── x_e [N, H]
//   combine:           y_e [N, H] (partial over expert TP) ── reverse ── unpermute x probs ── y [T, H]
//   combine_backward:  dy ── d y_e (full), dprobs
//   dispatch_backward: d x_e (partial over expert TP) ── reverse ── dx [T, H]
//
// Two dispatchers, the same function:
//   * alltoall: slots are permuted in global expert-major order, the counts then the rows travel
//     with an uneven all-to-all over the EP group (rank p gets the rows of its experts), are
//     all-gathered over expert TP (variable sizes) and re-sorted from (expert-TP rank, EP rank,
//     expert) to (expert, expert-TP rank, EP rank) order; the way back reduce-scatters over
//     expert TP (summing the partial fc2 outputs) and all-to-alls back; the probs weigh the rows
//     where the tokens live.
//   * allgather: rows, routing and probs are all-gathered over EP then expert TP; each rank
//     permutes the slots of its own experts out of the gathered set and weighs its outputs;
//     the way back reduce-scatters over expert TP then EP.
// The expert input x_e lists rows expert by expert (local experts in order); rows_per_expert()
// gives the group sizes of the expert GEMMs. Dropless routing needs the counts on the host
// before the all-to-all (one device-to-host copy per layer and micro-batch, as in Megatron).
#pragma once
#include <cstdint>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/model_parallel.h"

namespace megadlm::ep {

enum class DispatcherKind { AllGather, AllToAll };

class TokenDispatcher {
 public:
  /// What the backward halves need (one per in-flight micro-batch).
  struct Saved {
    int64_t tokens = 0;           ///< T: this rank's routed rows
    Tensor dest;                  ///< i32 [T_g, K]: each slot's row in the permuted set
    Tensor probs;                 ///< [T_g, K] routing weights (allgather: gathered)
    Tensor weighed;               ///< the rows the probs multiplied (for dprobs)
    std::vector<int64_t> rows_per_expert;  ///< local experts' row counts (host)
    // alltoall
    std::vector<int64_t> send_rows, recv_rows;  ///< per EP member
    std::vector<int64_t> etp_rows;              ///< per expert-TP member, after the all-to-all
    std::vector<int64_t> chunks;                ///< [etp][ep][local expert] rows, received order
    /// i32 gather_rows indices between the received and the expert-major order (undefined
    /// when the two orders agree: one local expert, or neither EP nor expert TP)
    Tensor sort_to_expert_major, sort_to_received;
    // allgather
    std::vector<int64_t> ep_rows, etp_gather_rows;  ///< rows held by each EP / expert-TP member
    /// With `source_chunks`: [local expert][source] rows of the expert-major output, where the
    /// sources are the members of this rank's expert-TP x EP grid (source a * ep + b: expert-TP
    /// rank a, EP rank b), in the order they appear within each expert. One source (this
    /// rank) without EP and expert TP. FP8 expert GEMMs scale each source's rows separately.
    std::vector<int64_t> source_rows;
  };

  TokenDispatcher() = default;
  /// `num_experts`: global experts of the layer; this rank holds experts
  /// [ep_rank * E / ep, (ep_rank + 1) * E / ep).
  TokenDispatcher(DispatcherKind kind, int num_experts, const ModelParallel& mp,
                  bool source_chunks = false);
  /// Members of the expert-TP x EP grid (the sources of source_rows) and this rank's index.
  int sources() const { return mp_.expert_tp.size * mp_.ep.size; }
  int self_source() const { return mp_.expert_tp.rank * mp_.ep.size + mp_.ep.rank; }

  int local_experts() const { return local_; }
  int first_expert() const { return first_; }

  /// x [T, H], indices i32 [T, K] (global experts, -1: not dispatched), probs [T, K] ->
  /// the local experts' input rows [N, H], expert-major. Collective over EP and expert TP.
  Tensor dispatch(const Tensor& x, const Tensor& indices, const Tensor& probs, Saved& s,
                  const Stream& stream) const;
  /// Expert outputs [N, H] (partial sums over expert TP) -> y [T, H] = sum_j probs[t, j] *
  /// expert_j(x[t]) (written). Collective.
  Tensor combine(const Tensor& expert_out, Saved& s, const Stream& stream) const;
  /// dy [T, H] -> the gradient of the expert outputs [N, H]; dprobs [T, K] (f32, written).
  Tensor combine_backward(const Tensor& dy, Saved& s, Tensor& dprobs, const Stream& stream) const;
  /// Gradient of the expert input [N, H] (partial over expert TP) -> dx [T, H] (written).
  /// Clears `s`.
  Tensor dispatch_backward(const Tensor& dx_expert, Saved& s, const Stream& stream) const;

 private:
  // alltoall: permuted rows (global expert-major) <-> the local experts' rows.
  Tensor to_experts(const Tensor& x_perm, const Saved& s, const Stream& stream) const;
  Tensor from_experts(const Tensor& y, const Saved& s, const Stream& stream) const;
  /// Rows of a gathered set in the allgather dispatcher: over EP, then expert TP.
  Tensor gather(const Tensor& x, const Saved& s, const Stream& stream) const;
  Tensor reduce_scatter(const Tensor& full, const Saved& s, const Stream& stream) const;

  DispatcherKind kind_ = DispatcherKind::AllGather;
  ModelParallel mp_;
  int num_experts_ = 0, local_ = 0, first_ = 0;
  bool source_chunks_ = false;
};

}  // namespace megadlm::ep
