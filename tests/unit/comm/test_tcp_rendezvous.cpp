// The TCP exchange of the NCCL id (src/comm/tcp_rendezvous.h) on the loopback interface, with
// threads playing the ranks: every rank gets rank 0's bytes, whichever starts first, and every
// failure (nobody listening, a wrong world size, a rank twice) ends within the deadline with a
// message naming the address, the ranks and what to check. Rank 0's socket is open to anyone:
// connections without the job's token, garbage, oversized, half-open, slow or too many
// connections are refused without ending (or noticeably delaying) the serve.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <future>
#include <map>
#include <thread>
#include "comm/tcp_rendezvous.h"
#include "megadlm/comm/bootstrap.h"
#include "megadlm/comm/communicator.h"

using namespace megadlm;
using namespace megadlm::comm;
using namespace megadlm::comm::detail;
using std::chrono::milliseconds;

namespace {

const std::string kToken = "slurm:4242.0";

std::vector<uint8_t> id_bytes() {
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
  return id;
}

/// A blocking TCP connection to 127.0.0.1:port (-1 when refused).
int connect_raw(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

/// A hello as the protocol writes it (version 2), with any fields.
std::vector<uint8_t> hello(uint32_t rank, uint32_t world, const std::string& token, uint32_t token_len) {
  std::vector<uint8_t> h;
  put_be32(h, 0x4d444c4d);
  put_be32(h, 2);
  put_be32(h, rank);
  put_be32(h, world);
  put_be32(h, token_len);
  h.insert(h.end(), token.begin(), token.end());
  return h;
}

void send_all(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (k <= 0) return;  // the server closed it: fine for a hostile client
    done += static_cast<size_t>(k);
  }
}

using Clock = std::chrono::steady_clock;

/// A port that was free a moment ago (the kernel's choice for port 0).
int free_port() {
  TcpRendezvousServer probe(0);
  return probe.port();
}

}  // namespace

TEST(TcpRendezvous, EveryRankReceivesRankZerosBytes) {
  const int world = 4;
  TcpRendezvousServer server(0);
  const int port = server.port();
  std::vector<std::future<std::vector<uint8_t>>> clients;
  for (int r = 1; r < world; ++r)
    clients.push_back(std::async(std::launch::async, [=] {
      return tcp_rendezvous_fetch("127.0.0.1", port, r, world, kToken, milliseconds(10000));
    }));
  server.serve(world, id_bytes(), kToken, milliseconds(10000));
  for (auto& c : clients) EXPECT_EQ(c.get(), id_bytes());
}

TEST(TcpRendezvous, ClientsThatStartBeforeRankZeroRetry) {
  const int port = free_port();
  auto client = std::async(std::launch::async, [=] {
    return tcp_rendezvous_fetch("localhost", port, 1, 2, kToken, milliseconds(10000));
  });
  std::this_thread::sleep_for(milliseconds(500));  // refused connections in the meantime
  TcpRendezvousServer server(port);
  server.serve(2, id_bytes(), kToken, milliseconds(10000));
  EXPECT_EQ(client.get(), id_bytes());
}

TEST(TcpRendezvous, AClientWithNobodyListeningTimesOutNamingTheAddress) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    tcp_rendezvous_fetch("127.0.0.1", port, 3, 4, kToken, milliseconds(600));
    ADD_FAILURE() << "fetched from nobody";
  } catch (const CommTimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MASTER_ADDR:MASTER_PORT = 127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 3 of 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(5000));
}

TEST(TcpRendezvous, RankZeroTimesOutNamingTheMissingRanks) {
  TcpRendezvousServer server(0);
  const int port = server.port();
  auto client = std::async(std::launch::async, [=] {
    return tcp_rendezvous_fetch("127.0.0.1", port, 2, 4, kToken, milliseconds(10000));
  });
  try {
    server.serve(4, id_bytes(), kToken, milliseconds(1500));
    ADD_FAILURE() << "served a world of 4 with one client";
  } catch (const CommTimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("2 of 3 never connected (ranks 1, 3)"), std::string::npos) << msg;
  }
  EXPECT_EQ(client.get(), id_bytes());  // rank 2 itself was served
}

TEST(TcpRendezvous, DifferentWorldSizesAreAnErrorOnBothSides) {
  TcpRendezvousServer server(0);
  const int port = server.port();
  auto client = std::async(std::launch::async, [=] {
    return tcp_rendezvous_fetch("127.0.0.1", port, 1, 3, kToken, milliseconds(10000));
  });
  try {
    server.serve(2, id_bytes(), kToken, milliseconds(10000));
    ADD_FAILURE() << "served a client of another world size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE 3, but rank 0 has WORLD_SIZE 2"), std::string::npos)
        << e.what();
  }
  try {
    client.get();
    ADD_FAILURE() << "the client accepted a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same WORLD_SIZE"), std::string::npos) << e.what();
  }
}

TEST(TcpRendezvous, ATakenPortIsReportedAsSuch) {
  TcpRendezvousServer first(0);
  try {
    TcpRendezvousServer second(first.port());
    ADD_FAILURE() << "two servers on one port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("listen on port " + std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

TEST(TcpRendezvous, AnotherJobsTokenIsRefusedWithoutEndingTheServe) {
  TcpRendezvousServer server(0);
  const int port = server.port();
  // Another job that picked the same MASTER_PORT: even its (wrong) world size must not end the
  // serve, since nothing a tokenless client says is believed.
  auto stranger = std::async(std::launch::async, [=] {
    return tcp_rendezvous_fetch("127.0.0.1", port, 1, 16, "slurm:9999.0", milliseconds(10000));
  });
  std::this_thread::sleep_for(milliseconds(300));
  auto rank1 = std::async(std::launch::async, [=] {
    return tcp_rendezvous_fetch("127.0.0.1", port, 1, 2, kToken, milliseconds(10000));
  });
  server.serve(2, id_bytes(), kToken, milliseconds(10000));
  EXPECT_EQ(rank1.get(), id_bytes());
  try {
    stranger.get();
    ADD_FAILURE() << "a process with another job's token got the NCCL id";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it expects another job token"), std::string::npos) << e.what();
  }
  EXPECT_GE(server.refused(), 1);
}

// Garbage, a hello announcing a token of 1 GB, half-open connections, a slow-loris client and
// tokenless claims of a bad world size all arrive before the real ranks: the serve neither fails
// nor waits for them (each gets its own short window; the real ranks are served at once).
TEST(TcpRendezvous, GarbageHalfOpenSlowAndOversizedConnectionsDoNotStopTheRealRanks) {
  TcpRendezvousServer server(0);
  const int port = server.port();
  const auto start = Clock::now();
  auto served = std::async(std::launch::async, [&] { server.serve(3, id_bytes(), kToken, milliseconds(20000)); });
  std::vector<int> hostile;
  for (int i = 0; i < 40; ++i) hostile.push_back(connect_raw(port));  // half-open: never speak
  const int garbage = connect_raw(port);
  std::vector<uint8_t> junk(4096);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 131 + 7);
  send_all(garbage, junk);
  const int oversized = connect_raw(port);
  send_all(oversized, hello(1, 3, "", 1u << 30));
  const int liar = connect_raw(port);
  send_all(liar, hello(1, 99, "no-token", 8));  // a world size of 99 without the token
  const int slow = connect_raw(port);
  std::thread loris([&] {  // half a hello, one byte every 300 ms, while the real ranks arrive
    const std::vector<uint8_t> h = hello(2, 3, kToken, static_cast<uint32_t>(kToken.size()));
    for (size_t i = 0; i < 10; ++i) {
      send_all(slow, {h[i]});
      std::this_thread::sleep_for(milliseconds(300));
    }
  });
  std::this_thread::sleep_for(milliseconds(300));
  const auto real_start = Clock::now();
  std::vector<std::future<std::vector<uint8_t>>> ranks;
  for (int r = 1; r < 3; ++r)
    ranks.push_back(std::async(std::launch::async, [=] {
      return tcp_rendezvous_fetch("127.0.0.1", port, r, 3, kToken, milliseconds(20000));
    }));
  for (auto& r : ranks) EXPECT_EQ(r.get(), id_bytes());
  served.get();  // no exception: nothing hostile ended the serve
  EXPECT_LT(Clock::now() - real_start, milliseconds(3000)) << "the real ranks waited for the hostile ones";
  EXPECT_LT(Clock::now() - start, milliseconds(10000));
  EXPECT_GE(server.refused(), 3);  // the garbage, the oversized hello and the liar at least
  loris.join();
  for (int fd : hostile) ::close(fd);
  for (int fd : {garbage, oversized, liar, slow}) ::close(fd);
}

// More connections than the server keeps: the oldest silent ones make room, so a flood of
// half-open connections cannot lock the real rank out.
TEST(TcpRendezvous, AFloodOfSilentConnectionsCannotLockARankOut) {
  TcpRendezvousServer server(0);
  const int port = server.port();
  auto served = std::async(std::launch::async, [&] { server.serve(2, id_bytes(), kToken, milliseconds(20000)); });
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(connect_raw(port));  // beyond 2 + 64 slots
  std::this_thread::sleep_for(milliseconds(300));
  const auto t0 = Clock::now();
  EXPECT_EQ(tcp_rendezvous_fetch("127.0.0.1", port, 1, 2, kToken, milliseconds(20000)), id_bytes());
  served.get();
  EXPECT_LT(Clock::now() - t0, milliseconds(3000));
  EXPECT_GE(server.refused(), 100);
  for (int fd : flood)
    if (fd >= 0) ::close(fd);
}

// The other direction: something on MASTER_PORT accepts but never answers. The client gives up
// at its own deadline instead of hanging.
TEST(TcpRendezvous, AClientFacingASilentServerTimesOut) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const auto t0 = Clock::now();
  EXPECT_THROW(tcp_rendezvous_fetch("127.0.0.1", port, 1, 2, kToken, milliseconds(1500)), CommTimeoutError);
  EXPECT_LT(Clock::now() - t0, milliseconds(5000));
  ::close(fd);
}

TEST(TcpRendezvous, TheTokenComesFromTheLauncher) {
  auto env = [](std::map<std::string, std::string> vars) {
    return detect_launch_environment([vars](const char* name) -> std::optional<std::string> {
      auto it = vars.find(name);
      if (it == vars.end()) return std::nullopt;
      return it->second;
    });
  };
  const std::map<std::string, std::string> torch = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                                    {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "n0"},
                                                    {"MASTER_PORT", "29500"}};
  EXPECT_EQ(env(torch).job_token, "");
  auto with = [&](std::map<std::string, std::string> extra) {
    std::map<std::string, std::string> v = torch;
    v.insert(extra.begin(), extra.end());
    return env(v);
  };
  EXPECT_EQ(with({{"TORCHELASTIC_RUN_ID", "3f2a"}}).job_token, "torchrun:3f2a");
  EXPECT_EQ(with({{"SLURM_JOB_ID", "881"}, {"SLURM_STEP_ID", "2"}}).job_token, "slurm:881.2");
  const LaunchEnvironment explicit_token =
      with({{"MEGADLM_RENDEZVOUS_TOKEN", "s3cret"}, {"TORCHELASTIC_RUN_ID", "3f2a"}});
  EXPECT_EQ(explicit_token.job_token, "s3cret");  // an explicit token wins
  EXPECT_EQ(explicit_token.job_token_source, "MEGADLM_RENDEZVOUS_TOKEN");
}
