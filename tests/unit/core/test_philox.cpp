#include <gtest/gtest.h>
#include "megadlm/core/philox.h"

using namespace megadlm;

// Known-answer vectors of Philox-4x32-10 published with Random123 (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  PhiloxWords z = philox4x32(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(z.w[0], 0x6627e8d5u);
  EXPECT_EQ(z.w[1], 0xe169c58du);
  EXPECT_EQ(z.w[2], 0xbc57ac4cu);
  EXPECT_EQ(z.w[3], 0x9b00dbd8u);
  PhiloxWords f = philox4x32(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(f.w[0], 0x408f276du);
  EXPECT_EQ(f.w[1], 0x41c83b0eu);
  EXPECT_EQ(f.w[2], 0xa20bc7c6u);
  EXPECT_EQ(f.w[3], 0x6d5451fdu);
  PhiloxWords p = philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                             0x299f31d0u);
  EXPECT_EQ(p.w[0], 0xd16cfe09u);
  EXPECT_EQ(p.w[1], 0x94fdccebu);
  EXPECT_EQ(p.w[2], 0x5001e420u);
  EXPECT_EQ(p.w[3], 0x24126ea1u);
}

TEST(Philox, UniformIsInUnitIntervalAndHasTheRightMean) {
  PhiloxKey key = PhiloxKey::make(1234, RngPurpose::DiffusionMask);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    float u = uniform_from_u32(philox(key, static_cast<uint32_t>(i), 0, 0, 0).w[0]);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // Standard error of the mean of U(0,1) over n draws is sqrt(1/12/n) ~ 6.5e-4; allow 5 sigma.
  EXPECT_NEAR(sum / n, 0.5, 5 * std::sqrt(1.0 / 12.0 / n));
}

TEST(Philox, NormalHasUnitVariance) {
  PhiloxKey key = PhiloxKey::make(7, RngPurpose::WeightInit);
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    PhiloxWords w = philox(key, static_cast<uint32_t>(i), 0, 0, 0);
    double x = normal_from_words(w.w[0], w.w[1]);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
}

TEST(Philox, PurposesGiveIndependentStreams) {
  PhiloxKey a = PhiloxKey::make(5, RngPurpose::DiffusionMask);
  PhiloxKey b = PhiloxKey::make(5, RngPurpose::DiffusionTime);
  EXPECT_NE(philox(a, 1, 2, 3, 4).w[0], philox(b, 1, 2, 3, 4).w[0]);
}
