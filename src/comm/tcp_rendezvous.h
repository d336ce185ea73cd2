// Internal to comm/: the small TCP exchange that hands rank 0's NCCL unique id to every other
// rank when no MPI is running (torchrun-style launches, Slurm without MPI). Rank 0 listens at
// MASTER_PORT on every interface; each other rank connects to MASTER_ADDR:MASTER_PORT (retrying
// until the deadline while rank 0 is not up yet), says who it is, and receives the payload.
// Wire format (big-endian u32 words): hello = magic, version, rank, world_size;
// reply = magic, status (0 ok, else why refused), payload length, payload bytes.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace megadlm::comm::detail {

class TcpRendezvousServer {
 public:
  /// Listens on `port` (0: any free port, see port()). Throws naming the port when it is taken.
  explicit TcpRendezvousServer(int port);
  ~TcpRendezvousServer();
  TcpRendezvousServer(const TcpRendezvousServer&) = delete;
  TcpRendezvousServer& operator=(const TcpRendezvousServer&) = delete;

  int port() const { return port_; }
  /// Gives `payload` to ranks 1 .. world_size-1, each once. Throws CommTimeoutError naming the
  /// ranks that did not arrive within `timeout`, megadlm::Error when a client reports another
  /// world size or a rank twice.
  void serve(int world_size, const std::vector<uint8_t>& payload, std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// Rank `rank` (>= 1) fetches the payload from the server at host:port. Throws CommTimeoutError
/// (naming MASTER_ADDR:MASTER_PORT and the last connection error) when it cannot within `timeout`.
std::vector<uint8_t> tcp_rendezvous_fetch(const std::string& host, int port, int rank,
                                          int world_size, std::chrono::milliseconds timeout);

}  // namespace megadlm::comm::detail
