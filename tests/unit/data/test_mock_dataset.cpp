#include <gtest/gtest.h>
#include "megadlm/data/mock_dataset.h"

using namespace megadlm;

TEST(MockGptDataset, ConsecutiveSamplesShareOneToken) {
  MockGptDataset d(1000, 64, 500);
  for (int64_t i = 0; i < 50; ++i) {
    auto a = d.sample(i), b = d.sample(i + 1);
    ASSERT_EQ(a.size(), 65u);
    EXPECT_EQ(a.back(), b.front());
  }
}

TEST(MockGptDataset, DocumentsCountUpAndEndWithEod) {
  MockGptDataset d(100000, 512, 77777);
  // Stream tokens: after an EOD the next document starts at 1; within a document ids increase by 1.
  std::vector<int32_t> stream;
  for (int64_t i = 0; i < 40; ++i) {
    auto s = d.sample(i);
    stream.insert(stream.end(), s.begin(), s.end() - 1);
  }
  int eods = 0;
  for (size_t k = 1; k < stream.size(); ++k) {
    if (stream[k - 1] == MockGptDataset::kEod) {
      EXPECT_EQ(stream[k], 1);
      ++eods;
    } else if (stream[k] != MockGptDataset::kEod) {
      EXPECT_EQ(stream[k], stream[k - 1] + 1);
    }
  }
  EXPECT_GT(eods, 2);  // mean document length ~2048 over 20480 tokens
}

TEST(MockGptDataset, NeverEmitsTheMaskTokenOrIdsOutsideTheVocabulary) {
  MockGptDataset d(50, 128, 20);
  for (int64_t i = 0; i < 100; ++i)
    for (int32_t t : d.sample(i)) {
      EXPECT_NE(t, 20);
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 50);
    }
}

TEST(MockGptDataset, IsDeterministicAndSeedDependent) {
  MockGptDataset a(1000, 32, 999), b(1000, 32, 999), c(1000, 32, 999, 5);
  EXPECT_EQ(a.sample(123), b.sample(123));
  bool differ = false;
  for (int64_t i = 0; i < 200 && !differ; ++i) differ = a.sample(i) != c.sample(i);
  EXPECT_TRUE(differ);
}
