// Internal to comm/: the small TCP exchange that hands rank 0's NCCL unique id to every other
// rank when no MPI is running (torchrun-style launches, Slurm without MPI). Rank 0 listens at
// MASTER_PORT on every interface; each other rank connects to MASTER_ADDR:MASTER_PORT (retrying
// until the deadline while rank 0 is not up yet), says who it is, and receives the payload.
// Rank 0's socket is the job's one listening socket, reachable by anything on the network, so
// it trusts nothing: a client must present the job's token (comm/bootstrap reads it from the
// launcher's environment) before any of its claims count; every message has a bounded size;
// connections are served concurrently with a deadline each, so garbage, half-open, slow or
// too many connections can neither crash rank 0 nor delay the real ranks for long.
// Wire format (big-endian u32 words): hello = magic, version 2, rank, world_size, token length
// (at most kMaxTokenBytes), token bytes; reply = magic, status (0 ok, else why refused),
// payload length, payload bytes.
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
  /// ranks that did not arrive within `timeout`, megadlm::Error when a client holding the job's
  /// token reports another world size or a rank twice. Connections without the token (or not
  /// speaking the protocol, or too slow) are refused and closed; they never end the serve.
  void serve(int world_size, const std::vector<uint8_t>& payload, const std::string& token,
             std::chrono::milliseconds timeout);
  /// Connections refused so far (wrong token, garbage, too slow, evicted): for tests and logs.
  int refused() const { return refused_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  int refused_ = 0;
};

inline constexpr size_t kMaxTokenBytes = 256;

/// Rank `rank` (>= 1) fetches the payload from the server at host:port, presenting `token`.
/// Throws CommTimeoutError (naming MASTER_ADDR:MASTER_PORT and the last connection error) when it
/// cannot within `timeout`, megadlm::Error when rank 0 refuses its token, rank or world size.
std::vector<uint8_t> tcp_rendezvous_fetch(const std::string& host, int port, int rank,
                                          int world_size, const std::string& token,
                                          std::chrono::milliseconds timeout);

}  // namespace megadlm::comm::detail
