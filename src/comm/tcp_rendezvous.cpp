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
constexpr uint32_t kVersion = 2;  // 2: the hello carries the job token
enum Status : uint32_t { kOk = 0, kWrongWorld = 1, kBadRank = 2, kDuplicateRank = 3, kBadToken = 4 };
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
        MDLM_FAIL("rank 0 cannot listen on port ", port, " for the NCCL id rendezvous: ",
                  errno_text(err), "; another program (or an earlier run) holds it: choose a free "
                  "MASTER_PORT, or MEGADLM_RENDEZVOUS_PORT (under torchrun the rendezvous uses "
                  "MASTER_PORT + 1, since torchrun's own store holds MASTER_PORT)");
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

namespace {

// One accepted connection of the server: its hello being read, then its reply being written.
struct Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::vector<uint8_t> in;   // hello bytes received so far (bounded by kHelloMax)
  std::vector<uint8_t> out;  // reply, once the hello is complete
  size_t sent = 0;
  int rank = -1;
  Status status = kOk;
  bool writing() const { return !out.empty(); }
};

constexpr size_t kHelloHead = 20;  // magic, version, rank, world, token length
constexpr size_t kHelloMax = kHelloHead + kMaxTokenBytes;

// Equal strings in time independent of where they differ (a token guessed byte by byte must not
// be told how many leading bytes it got right).
bool same_token(const uint8_t* a, size_t na, const std::string& b) {
  uint8_t diff = static_cast<uint8_t>(na != b.size());
  for (size_t i = 0; i < na; ++i) diff |= static_cast<uint8_t>(a[i] ^ static_cast<uint8_t>(b[i % std::max<size_t>(b.size(), 1)]));
  return diff == 0 && na == b.size();
}

}  // namespace

void TcpRendezvousServer::serve(int world_size, const std::vector<uint8_t>& payload,
                                const std::string& token, milliseconds timeout) {
  MDLM_CHECK(payload.size() <= kMaxPayload, "rendezvous payload of ", payload.size(), " bytes");
  MDLM_CHECK(token.size() <= kMaxTokenBytes, "a rendezvous token of ", token.size(), " bytes (at most ",
             kMaxTokenBytes, ")");
  const auto deadline = Clock::now() + timeout;
  std::vector<bool> arrived(static_cast<size_t>(world_size), false);
  arrived[0] = true;
  int missing = world_size - 1;
  // Every rank may connect at once; beyond that, a bounded reserve for strangers. When full, the
  // oldest connection still sending its hello makes room (a half-open one cannot hold a slot).
  const size_t max_connections = static_cast<size_t>(std::min(world_size, 4096)) + 64;
  std::vector<Connection> conns;
  auto drop = [&](size_t i, bool refused) {
    close(conns[i].fd);
    conns.erase(conns.begin() + static_cast<long>(i));
    if (refused) ++refused_;
  };
  // A connection's whole exchange gets a short window: a silent or slow peer loses only its own.
  const milliseconds per_connection(5000);
  while (missing > 0) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::string list;
      int shown = 0;
      for (int r = 1; r < world_size && shown < 16; ++r)
        if (!arrived[static_cast<size_t>(r)]) list += concat(shown++ ? ", " : "", r);
      if (missing > shown) list += concat(" and ", missing - shown, " more");
      for (Connection& c : conns) close(c.fd);
      throw CommTimeoutError(concat(
          "CommTimeoutError: rank 0 waited ", timeout.count(), " ms at MASTER_PORT ", port_,
          " for the other ranks to fetch the NCCL id; ", missing, " of ", world_size - 1,
          " never connected (ranks ", list, ")", refused_ > 0 ? concat("; ", refused_, " connection(s) were refused "
          "(no or another job token, not this protocol, or too slow)") : std::string(),
          ". Check that every rank was started with the same MASTER_ADDR (this host), MASTER_PORT and "
          "job token (docs/launching.md), and that the port is reachable from their nodes"));
    }
    // Expired connections go first.
    for (size_t i = conns.size(); i-- > 0;)
      if (now >= conns[i].deadline) drop(i, true);
    std::vector<pollfd> fds;
    fds.push_back({fd_, POLLIN, 0});
    auto wake = deadline;
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.writing() ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.deadline);
    }
    const int pr = poll(fds.data(), fds.size(), ms_left(wake));
    if (pr < 0 && errno == EINTR) continue;
    MDLM_CHECK(pr >= 0, "poll() on the rendezvous socket failed: ", errno_text(errno));
    // Existing connections first (fds[k + 1] is conns[k]); accepting may evict, which would
    // shift them.
    const size_t polled = fds.size() - 1;
    for (size_t k = polled; k-- > 0;) {
      if (fds[k + 1].revents == 0) continue;
      Connection& c = conns[k];
      if (!c.writing()) {
        uint8_t buf[512];
        const size_t want = c.in.size() < kHelloHead ? kHelloHead - c.in.size()
                                                     : kHelloHead + get_u32(c.in.data() + 16) - c.in.size();
        const ssize_t got = ::recv(c.fd, buf, std::min(sizeof(buf), want), 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (got <= 0) {  // closed or reset before a complete hello
          drop(k, true);
          continue;
        }
        c.in.insert(c.in.end(), buf, buf + got);
        if (c.in.size() == kHelloHead) {
          // Not this protocol, or a token longer than any real one: refused without a word.
          if (get_u32(c.in.data()) != kMagic || get_u32(c.in.data() + 4) != kVersion ||
              get_u32(c.in.data() + 16) > kMaxTokenBytes) {
            drop(k, true);
            continue;
          }
        }
        if (c.in.size() < kHelloHead || c.in.size() < kHelloHead + get_u32(c.in.data() + 16)) continue;
        const uint8_t* h = c.in.data();
        const size_t token_len = get_u32(h + 16);
        const int rank = static_cast<int>(get_u32(h + 8));
        const int world = static_cast<int>(get_u32(h + 12));
        // The token first: without it, nothing the client says is believed (its world size or
        // rank could otherwise end rank 0's serve).
        if (!same_token(h + kHelloHead, token_len, token)) c.status = kBadToken;
        else if (world != world_size) c.status = kWrongWorld;
        else if (rank < 1 || rank >= world_size) c.status = kBadRank;
        else if (arrived[static_cast<size_t>(rank)]) c.status = kDuplicateRank;
        c.rank = rank;
        const bool ok = c.status == kOk;
        c.out.resize(12 + (ok ? payload.size() : 0));
        put_u32(c.out.data(), kMagic);
        put_u32(c.out.data() + 4, c.status);
        put_u32(c.out.data() + 8, static_cast<uint32_t>(ok ? payload.size() : 0));
        if (ok) std::copy(payload.begin(), payload.end(), c.out.begin() + 12);
        continue;  // written when the socket is writable
      }
      const ssize_t put = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (put < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (put <= 0) {  // the client vanished; if it retries it is welcome again
        drop(k, c.status != kOk);
        continue;
      }
      c.sent += static_cast<size_t>(put);
      if (c.sent < c.out.size()) continue;
      const Status status = c.status;
      const int rank = c.rank, world = static_cast<int>(get_u32(c.in.data() + 12));
      drop(k, status != kOk);
      // A client with the job's token that disagrees about the job is a launch mistake: say so
      // on rank 0 too (the client got the reason in its reply).
      if (status == kWrongWorld) {
        for (Connection& o : conns) close(o.fd);
        MDLM_FAIL("a process connected to the NCCL id rendezvous at MASTER_PORT ", port_, " as rank ",
                  rank, " of WORLD_SIZE ", world, ", but rank 0 has WORLD_SIZE ", world_size,
                  "; every rank of one job must see the same WORLD_SIZE");
      }
      if (status == kBadRank) {
        for (Connection& o : conns) close(o.fd);
        MDLM_FAIL("a process connected to the NCCL id rendezvous as rank ", rank,
                  "; valid ranks are 1..", world_size - 1, " (rank 0 serves)");
      }
      if (status == kDuplicateRank) {
        for (Connection& o : conns) close(o.fd);
        MDLM_FAIL("two processes connected to the NCCL id rendezvous as rank ", rank,
                  "; every rank must be unique (check RANK / the launcher's rank variables)");
      }
      if (status == kOk && !arrived[static_cast<size_t>(rank)]) {
        arrived[static_cast<size_t>(rank)] = true;
        --missing;
      }
    }
    // New connections (as many as are waiting).
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;  // EAGAIN (no more), ECONNABORTED, EINTR, EMFILE: next round
        if (conns.size() >= max_connections) {
          size_t oldest = conns.size();
          for (size_t i = 0; i < conns.size(); ++i)
            if (!conns[i].writing() && (oldest == conns.size() || conns[i].deadline < conns[oldest].deadline)) oldest = i;
          if (oldest == conns.size()) {  // every slot is writing a reply: refuse the newcomer
            close(c);
            ++refused_;
            continue;
          }
          drop(oldest, true);
        }
        Connection conn;
        conn.fd = c;
        conn.deadline = std::min(deadline, Clock::now() + per_connection);
        conns.push_back(std::move(conn));
      }
    }
  }
  for (Connection& c : conns) close(c.fd);
}

std::vector<uint8_t> tcp_rendezvous_fetch(const std::string& host, int port, int rank,
                                          int world_size, const std::string& token,
                                          milliseconds timeout) {
  MDLM_CHECK(token.size() <= kMaxTokenBytes, "a rendezvous token of ", token.size(), " bytes (at most ",
             kMaxTokenBytes, ")");
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
        std::vector<uint8_t> hello(20 + token.size());
        put_u32(hello.data(), kMagic);
        put_u32(hello.data() + 4, kVersion);
        put_u32(hello.data() + 8, static_cast<uint32_t>(rank));
        put_u32(hello.data() + 12, static_cast<uint32_t>(world_size));
        put_u32(hello.data() + 16, static_cast<uint32_t>(token.size()));
        std::copy(token.begin(), token.end(), hello.begin() + 20);
        // One exchange gets a bounded window: whatever listens there must answer promptly, or
        // we try again (a stalled stranger on the port cannot keep us until the deadline).
        const auto exchange_deadline = std::min(deadline, Clock::now() + milliseconds(10000));
        std::string e = transfer(s.fd, hello.data(), hello.size(), true, exchange_deadline);
        uint8_t head[12];
        if (e.empty()) e = transfer(s.fd, head, sizeof(head), false, exchange_deadline);
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
        if (status == kBadToken)
          MDLM_FAIL("rank 0 at ", where, " refused rank ", rank, " of ", world_size, ": it expects another "
                    "job token. The two processes belong to different jobs (another job uses this "
                    "MASTER_PORT?), or MEGADLM_RENDEZVOUS_TOKEN / the launcher's job id differs between "
                    "them (docs/launching.md)");
        if (status == kBadRank || status == kDuplicateRank)
          MDLM_FAIL("rank 0 at ", where, " refused rank ", rank, " of ", world_size, ": ",
                    status == kBadRank ? "not a valid rank" : "another process already took it");
        MDLM_CHECK(status == kOk && n <= kMaxPayload, "rank 0 at ", where,
                   " sent an unknown reply (status ", status, ", ", n, " bytes)");
        std::vector<uint8_t> payload(n);
        e = transfer(s.fd, payload.data(), n, false, exchange_deadline);
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
