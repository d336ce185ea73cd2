#include <gtest/gtest.h>
#include <cmath>
#include "megadlm/training/lr_schedule.h"

using namespace megadlm;

namespace {
OptimizerConfig base(LrDecayStyle style) {
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.lr_warmup_iters = 10;
  c.lr_decay_iters = 110;
  c.decay_style = style;
  return c;
}
}  // namespace

TEST(LrSchedule, WarmupIsLinearFromInit) {
  OptimizerConfig c = base(LrDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 0.0);
  EXPECT_NEAR(learning_rate(c, 5), 0.5e-3, 1e-10);  // --lr is a float
  EXPECT_NEAR(learning_rate(c, 10), 1e-3, 1e-10);
  c.lr_warmup_init = 1e-4f;
  EXPECT_NEAR(learning_rate(c, 0), 1e-4, 1e-10);
}

TEST(LrSchedule, LinearCosineAndInverseSqrtMatchTheirFormulas) {
  OptimizerConfig lin = base(LrDecayStyle::Linear);
  EXPECT_NEAR(learning_rate(lin, 60), 1e-4 + 0.5 * 9e-4, 1e-10);
  EXPECT_NEAR(learning_rate(lin, 110), 1e-4, 1e-10);
  EXPECT_NEAR(learning_rate(lin, 500), 1e-4, 1e-10);
  OptimizerConfig cos = base(LrDecayStyle::Cosine);
  EXPECT_NEAR(learning_rate(cos, 35), 1e-4 + 9e-4 * 0.5 * (std::cos(M_PI * 0.25) + 1), 1e-10);
  OptimizerConfig isr = base(LrDecayStyle::InverseSquareRoot);
  EXPECT_NEAR(learning_rate(isr, 40), 1e-3 * std::sqrt(10.0) / std::sqrt(40.0), 1e-10);
  OptimizerConfig con = base(LrDecayStyle::Constant);
  EXPECT_NEAR(learning_rate(con, 100), 1e-3, 1e-10);
}

TEST(LrSchedule, WsdHoldsThenAnneals) {
  OptimizerConfig c = base(LrDecayStyle::WSD);
  c.lr_wsd_decay_iters = 20;  // anneal over iterations 90..110
  EXPECT_NEAR(learning_rate(c, 50), 1e-3, 1e-10);
  EXPECT_NEAR(learning_rate(c, 90), 1e-3, 1e-10);
  // exponential: coeff = 2 * 0.5^q - 1, q = 0.5 at step 100
  EXPECT_NEAR(learning_rate(c, 100), 1e-4 + 9e-4 * (2 * std::pow(0.5, 0.5) - 1), 1e-10);
  EXPECT_NEAR(learning_rate(c, 110), 1e-4, 1e-10);
  c.wsd_decay_style = WsdDecayStyle::Linear;
  EXPECT_NEAR(learning_rate(c, 100), 1e-4 + 9e-4 * 0.5, 1e-10);
  c.wsd_decay_style = WsdDecayStyle::Cosine;
  EXPECT_NEAR(learning_rate(c, 95), 1e-4 + 9e-4 * 0.5 * (std::cos(M_PI * 0.25) + 1), 1e-10);
}
