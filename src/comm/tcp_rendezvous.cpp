// TCP rendezvous for the NCCL unique id (tcp_rendezvous.h). Plain POSIX sockets, non-blocking
// with poll() so that every wait has the caller's deadline; IPv6 dual-stack when available.
#include "comm/tcp_rendezvous.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/error.h"

namespace megadlm::comm::detail {

using ::megadlm::detail::concat;

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x4d444c4d;  // "MDLM"
constexpr uint32_t kVersion = 1;
enum Status : uint32_t { kOk = 0, kWrongWorld = 1, kBadRank = 2, kDuplicateRank = 3 };
constexpr size_t kMaxPayload = 1 << 20;

std::string errno_text(int e) { return concat(std::strerror(e), " (errno ", e, ")"); }

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

/// Moves exactly n bytes (send or receive) on a non-blocking socket before the deadline.
/// Returns an empty string on success, else what went wrong.
std::string transfer(int fd, void* buf, size_t n, bool sending, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    pollfd pfd{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    const int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return errno_text(errno);
    if (pr == 0) return "timed out";
    const ssize_t k = sending ? ::send(fd, p + done, n - done, MSG_NOSIGNAL)
                              : ::recv(fd, p + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k < 0) return errno_text(errno);
    if (k == 0) return "the peer closed the connection";
    done += static_cast<size_t>(k);
  }
  return "";
}

void put_u32(uint8_t* p, uint32_t v) {
  const uint32_t be = htonl(v);
  std::memcpy(p, &be, 4);
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t be;
  std::memcpy(&be, p, 4);
  return ntohl(be);
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

/// Closes a socket when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

}  // namespace

TcpRendezvousServer::TcpRendezvousServer(int port) {
  MDLM_CHECK(port >= 0 && port <= 65535, "MASTER_PORT ", port, " is not a TCP port (1..65535)");
  int err = 0;
  // IPv6 dual-stack first (also accepts IPv4 clients); IPv4 only where IPv6 is disabled.
  fd_ = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ >= 0) {
    int off = 0, on = 1;
    setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      err = errno;
      close(fd_);
      fd_ = -1;
      if (err != EADDRNOTAVAIL && err != EAFNOSUPPORT) {
        MDLM_FAIL("rank 0 cannot listen on MASTER_PORT ", port, " for the NCCL id rendezvous: ",
                  errno_text(err), "; another program (or an earlier run) holds it: choose a free "
                  "MASTER_PORT");
      }
    }
  }
  if (fd_ < 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    MDLM_CHECK(fd_ >= 0, "cannot create a TCP socket for the NCCL id rendezvous: ", errno_text(errno));
    int on = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      err = errno;
      close(fd_);
      fd_ = -1;
      MDLM_FAIL("rank 0 cannot listen on MASTER_PORT ", port, " for the NCCL id rendezvous: ",
                errno_text(err), "; choose a free MASTER_PORT");
    }
  }
  if (listen(fd_, 256) != 0) {
    err = errno;
    close(fd_);
    fd_ = -1;
    MDLM_FAIL("listen() on MASTER_PORT ", port, " failed: ", errno_text(err));
  }
  set_nonblocking(fd_);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

TcpRendezvousServer::~TcpRendezvousServer() {
  if (fd_ >= 0) close(fd_);
}

void TcpRendezvousServer::serve(int world_size, const std::vector<uint8_t>& payload,
                                milliseconds timeout) {
  MDLM_CHECK(payload.size() <= kMaxPayload, "rendezvous payload of ", payload.size(), " bytes");
  const auto deadline = Clock::now() + timeout;
  std::vector<bool> arrived(static_cast<size_t>(world_size), false);
  arrived[0] = true;
  int missing = world_size - 1;
  while (missing > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    const int pr = poll(&pfd, 1, ms_left(deadline));
    if (pr < 0 && errno == EINTR) continue;
    MDLM_CHECK(pr >= 0, "poll() on the rendezvous socket failed: ", errno_text(errno));
    if (pr == 0) {
      std::string list;
      int shown = 0;
      for (int r = 1; r < world_size && shown < 16; ++r)
        if (!arrived[static_cast<size_t>(r)]) list += concat(shown++ ? ", " : "", r);
      if (missing > shown) list += concat(" and ", missing - shown, " more");
      throw CommTimeoutError(concat(
          "CommTimeoutError: rank 0 waited ", timeout.count(), " ms at MASTER_PORT ", port_,
          " for the other ranks to fetch the NCCL id; ", missing, " of ", world_size - 1,
          " never connected (ranks ", list, "). Check that every rank was started with the same "
          "MASTER_ADDR (this host) and MASTER_PORT, and that the port is reachable from their nodes"));
    }
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;  // EAGAIN, ECONNABORTED, EINTR: wait for the next one
    Fd client(c);
    uint8_t hello[16];
    // A client gets a short window; a silent or foreign connection must not stall the others.
    const auto client_deadline = std::min(deadline, Clock::now() + milliseconds(5000));
    if (!transfer(c, hello, sizeof(hello), false, client_deadline).empty()) continue;
    if (get_u32(hello) != kMagic || get_u32(hello + 4) != kVersion) continue;  // not one of ours
    const int rank = static_cast<int>(get_u32(hello + 8));
    const int world = static_cast<int>(get_u32(hello + 12));
    Status status = kOk;
    if (world != world_size) status = kWrongWorld;
    else if (rank < 1 || rank >= world_size) status = kBadRank;
    else if (arrived[static_cast<size_t>(rank)]) status = kDuplicateRank;
    std::vector<uint8_t> reply(12 + (status == kOk ? payload.size() : 0));
    put_u32(reply.data(), kMagic);
    put_u32(reply.data() + 4, status);
    put_u32(reply.data() + 8, static_cast<uint32_t>(status == kOk ? payload.size() : 0));
    if (status == kOk) std::copy(payload.begin(), payload.end(), reply.begin() + 12);
    const std::string sent = transfer(c, reply.data(), reply.size(), true, client_deadline);
    if (status == kWrongWorld)
      MDLM_FAIL("a process connected to the NCCL id rendezvous at MASTER_PORT ", port_, " as rank ",
                rank, " of WORLD_SIZE ", world, ", but rank 0 has WORLD_SIZE ", world_size,
                "; every rank of one job must see the same WORLD_SIZE (or another job uses this "
                "MASTER_PORT)");
    if (status == kBadRank)
      MDLM_FAIL("a process connected to the NCCL id rendezvous as rank ", rank,
                "; valid ranks are 1..", world_size - 1, " (rank 0 serves)");
    if (status == kDuplicateRank)
      MDLM_FAIL("two processes connected to the NCCL id rendezvous as rank ", rank,
                "; every rank must be unique (check RANK / the launcher's rank variables)");
    if (!sent.empty()) continue;  // the client vanished; if it retries it is welcome again
    arrived[static_cast<size_t>(rank)] = true;
    --missing;
  }
}

std::vector<uint8_t> tcp_rendezvous_fetch(const std::string& host, int port, int rank,
                                          int world_size, milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const std::string where = concat(host, ":", port);
  std::string last_error = "no attempt finished";
  for (;;) {
    if (Clock::now() >= deadline) break;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    const int gai = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
    if (gai != 0) {
      last_error = concat("cannot resolve MASTER_ADDR '", host, "': ", gai_strerror(gai));
    } else {
      const std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(list, freeaddrinfo);
      for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
        Fd s(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
        if (s.fd < 0) {
          last_error = concat("socket(): ", errno_text(errno));
          continue;
        }
        if (connect(s.fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
          last_error = concat("connect(): ", errno_text(errno));
          continue;
        }
        pollfd pfd{s.fd, POLLOUT, 0};
        const auto attempt_deadline = std::min(deadline, Clock::now() + milliseconds(2000));
        if (poll(&pfd, 1, ms_left(attempt_deadline)) <= 0) {
          last_error = "connect(): no answer";
          continue;
        }
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        if (so_error != 0) {
          last_error = concat("connect(): ", errno_text(so_error));
          continue;
        }
        uint8_t hello[16];
        put_u32(hello, kMagic);
        put_u32(hello + 4, kVersion);
        put_u32(hello + 8, static_cast<uint32_t>(rank));
        put_u32(hello + 12, static_cast<uint32_t>(world_size));
        std::string e = transfer(s.fd, hello, sizeof(hello), true, deadline);
        uint8_t head[12];
        if (e.empty()) e = transfer(s.fd, head, sizeof(head), false, deadline);
        if (!e.empty()) {
          last_error = concat("exchange with rank 0: ", e);
          continue;
        }
        if (get_u32(head) != kMagic) {
          last_error = "the process at MASTER_ADDR:MASTER_PORT is not a megadlm rank 0";
          continue;
        }
        const uint32_t status = get_u32(head + 4), n = get_u32(head + 8);
        if (status == kWrongWorld)
          MDLM_FAIL("rank ", rank, " has WORLD_SIZE ", world_size, " but rank 0 at ", where,
                    " has another; every rank of one job must see the same WORLD_SIZE");
        if (status == kBadRank || status == kDuplicateRank)
          MDLM_FAIL("rank 0 at ", where, " refused rank ", rank, " of ", world_size, ": ",
                    status == kBadRank ? "not a valid rank" : "another process already took it");
        MDLM_CHECK(status == kOk && n <= kMaxPayload, "rank 0 at ", where,
                   " sent an unknown reply (status ", status, ", ", n, " bytes)");
        std::vector<uint8_t> payload(n);
        e = transfer(s.fd, payload.data(), n, false, deadline);
        if (!e.empty()) {
          last_error = concat("receiving the NCCL id: ", e);
          continue;
        }
        return payload;
      }
    }
    // Rank 0 may not listen yet: retry until the deadline.
    std::this_thread::sleep_for(std::min<milliseconds>(milliseconds(200),
                                                       milliseconds(ms_left(deadline))));
  }
  throw CommTimeoutError(concat(
      "CommTimeoutError: rank ", rank, " of ", world_size, " could not fetch the NCCL id from rank 0 at "
      "MASTER_ADDR:MASTER_PORT = ", where, " within ", timeout.count(), " ms; last error: ",
      last_error, ". Rank 0 listens there once it starts: check that it is running, that "
      "MASTER_ADDR names its host as seen from this node, and that the port is open"));
}

}  // namespace megadlm::comm::detail
