// The TCP exchange of the NCCL id (src/comm/tcp_rendezvous.h) on the loopback interface, with
// threads playing the ranks: every rank gets rank 0's bytes, whichever starts first, and every
// failure (nobody listening, a wrong world size, a rank twice) ends within the deadline with a
// message naming the address, the ranks and what to check.
#include <gtest/gtest.h>
#include <future>
#include <thread>
#include "comm/tcp_rendezvous.h"
#include "megadlm/comm/communicator.h"

using namespace megadlm;
using namespace megadlm::comm;
using namespace megadlm::comm::detail;
using std::chrono::milliseconds;

namespace {

std::vector<uint8_t> id_bytes() {
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
  return id;
}

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
      return tcp_rendezvous_fetch("127.0.0.1", port, r, world, milliseconds(10000));
    }));
  server.serve(world, id_bytes(), milliseconds(10000));
  for (auto& c : clients) EXPECT_EQ(c.get(), id_bytes());
}

TEST(TcpRendezvous, ClientsThatStartBeforeRankZeroRetry) {
  const int port = free_port();
  auto client = std::async(std::launch::async, [=] {
    return tcp_rendezvous_fetch("localhost", port, 1, 2, milliseconds(10000));
  });
  std::this_thread::sleep_for(milliseconds(500));  // refused connections in the meantime
  TcpRendezvousServer server(port);
  server.serve(2, id_bytes(), milliseconds(10000));
  EXPECT_EQ(client.get(), id_bytes());
}

TEST(TcpRendezvous, AClientWithNobodyListeningTimesOutNamingTheAddress) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    tcp_rendezvous_fetch("127.0.0.1", port, 3, 4, milliseconds(600));
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
    return tcp_rendezvous_fetch("127.0.0.1", port, 2, 4, milliseconds(10000));
  });
  try {
    server.serve(4, id_bytes(), milliseconds(1500));
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
    return tcp_rendezvous_fetch("127.0.0.1", port, 1, 3, milliseconds(10000));
  });
  try {
    server.serve(2, id_bytes(), milliseconds(10000));
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
    EXPECT_NE(std::string(e.what()).find("MASTER_PORT " + std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}
