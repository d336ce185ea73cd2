// One group of ranks that talk to each other, with one interface for both transports:
// NCCL for CUDA tensors (stream-ordered, asynchronous with respect to the host) and MPI for CPU
// tensors (blocking from the caller's point of view, built on non-blocking MPI calls so that a
// deadline can be enforced). Created by comm/bootstrap (the world) and Communicator::split.
//
// Contract for every collective: all ranks of the group call it in the same order with the same
// element counts and dtypes; tensors are contiguous and on the communicator's device; element
// counts and the wire dtype come from the tensors (no byte counts anywhere). A collective that
// does not complete within the group's timeout raises CommTimeoutError naming the group, the
// operation, its sequence number and the rank (MPI: from the call; NCCL: from synchronize()).
// After a timeout the group is unusable (a collective is half done on some ranks): the program
// ends the job with DistributedRuntime::abort_job.
//
// Dtypes: NCCL moves and reduces bf16, f16, f32, f64, i32, i64. MPI moves every dtype (bf16/f16
// as raw 16-bit words) but reduces only f32, f64, i32, i64: the CPU backend computes in f32, so
// a bf16 reduction on the CPU is an error, not a silent conversion. Avg needs a floating dtype
// (MPI: sum, then divide by size; NCCL: ncclAvg).
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/comm/collective_record.h"
#include "megadlm/core/error.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::comm {

enum class ReduceOp { Sum, Avg, Max, Min };

/// A collective or transfer that did not finish within --distributed-timeout-minutes.
class CommTimeoutError : public Error {
 public:
  using Error::Error;
};

/// One side of a point-to-point transfer in batch_p2p.
struct P2POp {
  enum class Kind { Send, Recv };
  Kind kind = Kind::Send;
  Tensor tensor;  ///< sent from, or received into (shares storage with the caller's tensor)
  int peer = 0;   ///< rank in this communicator
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  /// Group name used in messages: "world", "tp", "dp", "dp-cp", ...
  virtual const std::string& name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Global (world) rank of member `group_rank` of this group.
  virtual int global_rank(int group_rank) const = 0;
  /// Cpu for MPI communicators, Cuda(local device) for NCCL ones.
  virtual Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  /// Bounds this group's later operations (a checkpoint barrier may need longer than a step's
  /// collectives; tests use seconds). Groups split from this one afterwards inherit it.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;

  /// In place: t = op over all ranks of t.
  virtual void all_reduce(Tensor& t, ReduceOp op, const Stream& stream) = 0;
  /// in [size * n] -> out [n]: rank r receives op over ranks of in[r*n, (r+1)*n).
  /// `out` may alias its slot of `in` (in[r*n, (r+1)*n)); no other overlap is allowed.
  virtual void reduce_scatter(const Tensor& in, Tensor& out, ReduceOp op, const Stream& stream) = 0;
  /// in [n] -> out [size * n], rank r's `in` at out[r*n, (r+1)*n). `in` may alias its slot of out.
  /// (The only overlap allowed.)
  virtual void all_gather(const Tensor& in, Tensor& out, const Stream& stream) = 0;
  /// t on every rank = t of `root` (group rank).
  virtual void broadcast(Tensor& t, int root, const Stream& stream) = 0;
  /// Uneven all-to-all over the flat elements: rank r sends in[send_offset(p) .. + send_counts[p])
  /// to each peer p and receives recv_counts[p] elements from p, packed in rank order into out.
  /// send_counts/recv_counts have size() entries each and sum to in.numel() / out.numel();
  /// send_counts[p] on rank r must equal recv_counts[r] on rank p (zero counts are allowed).
  virtual void all_to_all(const Tensor& in, const std::vector<int64_t>& send_counts, Tensor& out,
                          const std::vector<int64_t>& recv_counts, const Stream& stream) = 0;
  /// Point-to-point with another member (peer != rank(): a rank talks to itself only inside
  /// batch_p2p). The receiving tensor has the sender's element count and dtype.
  virtual void send(const Tensor& t, int peer, const Stream& stream) = 0;
  virtual void recv(Tensor& t, int peer, const Stream& stream) = 0;
  /// All sends and receives issued together (no ordering deadlock between them). Several
  /// transfers between the same pair match in the order they appear in `ops`.
  virtual void batch_p2p(const std::vector<P2POp>& ops, const Stream& stream) = 0;
  /// MPI: returns when every member has arrived. NCCL: stream-ordered like every other op (the
  /// host waits with synchronize()).
  virtual void barrier(const Stream& stream) = 0;

  /// Blocks the host until every operation this communicator queued on `stream` has finished,
  /// raising CommTimeoutError (naming the oldest unfinished operation) after the timeout. The one
  /// way host code waits on communication; no-op for MPI communicators.
  virtual void synchronize(const Stream& stream) = 0;

  /// Collective over this group: ranks with equal `color` form a new group, ordered by `key`
  /// (ties by rank in this group). `color` < 0: this rank joins no group (returns nullptr).
  /// The new group has this group's timeout and device; `name` appears in its messages.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  /// The last operations this group issued (comm/collective_record.h); null when the
  /// communicator keeps none (a one-rank group never waits on anybody).
  virtual const CollectiveRecord* collective_record() const { return nullptr; }

  /// Tears the group down after a failure so that no rank stays blocked in it (ncclCommAbort).
  /// Every later call on it throws. MPI: marks the group dead; ending the other processes is
  /// MPI_Abort's job (DistributedRuntime::abort_job), since MPI cannot cancel a collective.
  virtual void abort() noexcept = 0;
};

const char* reduce_op_name(ReduceOp op);

/// Collective over `parent`: cuts it into the groups of `partition` (disjoint lists of ranks of
/// `parent`; each list is its group's members in rank order) and returns this rank's group, named
/// `name`, or null when this rank is in none of the lists. Every rank must pass the same
/// partition. A partition made only of one-rank groups needs no communication: each listed rank
/// gets a local one-rank communicator.
std::shared_ptr<Communicator> split_by_members(Communicator& parent,
                                               const std::vector<std::vector<int>>& partition,
                                               const std::string& name);

}  // namespace megadlm::comm
