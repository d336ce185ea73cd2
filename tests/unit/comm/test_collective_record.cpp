// The last-collectives ring (comm/collective_record.h): it keeps the newest N operations in
// order, marks completions by sequence number, and writes a line per operation that says what
// it was and whether it finished (what a person compares across ranks after a hang).
#include <gtest/gtest.h>
#include <regex>
#include "megadlm/comm/collective_record.h"

using namespace megadlm;
using namespace megadlm::comm;

TEST(CollectiveRecord, KeepsTheNewestOperationsInOrderAndMarksCompletions) {
  CollectiveRecord r(4);
  for (uint64_t s = 1; s <= 6; ++s) r.begin(s, "all_reduce", static_cast<int64_t>(10 * s), DType::F32, "sum");
  r.complete(5);
  r.complete(2);  // already out of the ring: ignored
  const std::vector<CollectiveEntry> e = r.entries();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(r.issued(), 6u);
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(e[k].seq, 3 + k);
  EXPECT_EQ(e[1].count, 40);
  EXPECT_FALSE(e[0].completed);
  EXPECT_TRUE(e[2].completed);  // #5
  EXPECT_FALSE(e[3].completed);
}

TEST(CollectiveRecord, FormatsOneLinePerOperation) {
  CollectiveRecord r;
  r.begin(1, "broadcast", 128, DType::BF16, "root 0");
  r.begin(2, "barrier", 0, std::nullopt, "");
  r.complete(1);
  const std::string text = r.format("group 'dp' (rank 1 of 2)", std::chrono::system_clock::now());
  EXPECT_NE(text.find("group 'dp' (rank 1 of 2): 2 operation(s) issued, the last 2 below"), std::string::npos) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("\n  #1 +broadcast +128 bf16 +[0-9-]+ [0-9:.]+ after [0-9]+ ms  root 0\n")))
      << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("\n  #2 +barrier +0 - +[0-9-]+ [0-9:.]+ NOT COMPLETED \\(waiting [0-9]+ ms\\)\n")))
      << text;
}
