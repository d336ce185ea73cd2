// Internal to comm/: what every communicator shares — the registry abort_job walks, the argument
// checks of each operation (one place, so MPI, NCCL and the self communicator accept and reject
// exactly the same calls), and the wording of errors and timeouts.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>
#include "megadlm/comm/communicator.h"

namespace megadlm::comm::detail {

using ::megadlm::detail::concat;

/// The communicators created from one DistributedRuntime's world (splits included), so that
/// abort_job can abort them all. Owned by the runtime and shared with each communicator; a
/// communicator adds itself when constructed and removes itself when destroyed.
class CommRegistry {
 public:
  void add(Communicator* c);
  /// Also keeps the communicator's last collectives (its block of the file, as of now): a group
  /// destroyed while an error unwinds — the one that timed out, typically — must still be in
  /// the file abort_job writes afterwards.
  void remove(Communicator* c);
  /// Calls abort() on every live communicator (newest first, so splits go before the world).
  void abort_all() noexcept;

  /// Where write_collective_log() puts its file ("" = the system's temporary directory).
  void set_log_dir(std::string dir);
  /// Writes the collective records of every live communicator of this process, and of the
  /// last kMaxRetired destroyed ones, to
  /// <dir>/collectives_rank<R>.txt (in the temporary directory: megadlm_collectives_rank<R>_pid<P>.txt)
  /// with `reason` in its header; returns the path, or "" when it could not be written. Never throws.
  std::string write_collective_log(const std::string& reason) noexcept;

 private:
  static constexpr size_t kMaxRetired = 64;
  std::mutex mu_;
  std::vector<Communicator*> live_;
  std::vector<std::string> retired_;  // formatted blocks of destroyed communicators, oldest first
  std::string log_dir_;
};

/// "group 'dp' (rank 1 of 4, global rank 5, host gpu-node-3, device cuda:1)".
std::string describe(const Communicator& c);
/// This machine's name, for messages (read once per call; cheap).
std::string host_name();

/// "all_reduce #12 (f32[1024])"
std::string describe_op(const char* op, uint64_t seq, const std::string& detail);

/// Raises CommTimeoutError: what did not finish, who is waiting, for how long, and what to do.
/// With `registry`, this rank's last collectives are written first and the message names the file.
[[noreturn]] void throw_timeout(const Communicator& c, const std::string& op_text,
                                std::chrono::milliseconds waited, const std::string& extra,
                                CommRegistry* registry = nullptr);

/// The one cold function behind MDLM_MPI_CHECK / MDLM_NCCL_CHECK: the failing call, the
/// library's error code and text, who (group/rank/host/device) and where (file:line).
[[noreturn]] void throw_backend_error(const char* backend, const char* call, int code,
                                      const std::string& text, const std::string& who,
                                      const char* file, int line);

/// Whether an output buffer coincides with the one slot of the input it may alias.
enum class Aliasing { Disjoint, InPlace };

// ---- argument checks, one per operation (throw megadlm::Error naming group, op and rank) ----

/// A timeout must be positive.
void check_timeout(const Communicator& c, std::chrono::milliseconds timeout);
void check_usable(const Communicator& c, bool aborted, bool failed, const char* op);
void check_stream(const Communicator& c, const char* op, const Stream& stream);
void check_tensor(const Communicator& c, const char* op, const char* role, const Tensor& t);
/// Avg needs a floating dtype; `reduces_16bit` is false for MPI (no bf16/f16 reductions).
void check_reduction(const Communicator& c, const char* op, const Tensor& t, ReduceOp rop,
                     bool reduces_16bit);
void check_all_reduce(const Communicator& c, const Tensor& t, ReduceOp rop, bool reduces_16bit);
Aliasing check_reduce_scatter(const Communicator& c, const Tensor& in, const Tensor& out,
                              ReduceOp rop, bool reduces_16bit);
Aliasing check_all_gather(const Communicator& c, const Tensor& in, const Tensor& out);
void check_broadcast(const Communicator& c, const Tensor& t, int root);

/// Element offsets of each peer's block in the send and receive buffers of all_to_all.
struct AllToAllPlan {
  std::vector<int64_t> send_offsets;
  std::vector<int64_t> recv_offsets;
};
AllToAllPlan check_all_to_all(const Communicator& c, const Tensor& in,
                              const std::vector<int64_t>& send_counts, const Tensor& out,
                              const std::vector<int64_t>& recv_counts);
/// send/recv: peer in range and not this rank.
void check_p2p(const Communicator& c, const char* op, const Tensor& t, int peer);
/// batch_p2p: every op's tensor and peer (a peer may be this rank inside a batch).
void check_batch_p2p(const Communicator& c, const std::vector<P2POp>& ops);

/// "f32[4, 8]"
std::string tensor_text(const Tensor& t);

/// Host wait between polls of a pending operation: spin first (small collectives finish within
/// microseconds), then yield, then sleep, so that ranks waiting on a slow peer leave the cores to
/// it (oversubscribed CPU tests run 4 ranks on 2 cores).
void poll_pause(int spins, std::chrono::steady_clock::duration waited);

}  // namespace megadlm::comm::detail
