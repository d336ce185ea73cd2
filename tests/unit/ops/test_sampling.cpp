// ops::sample_proposals on the CPU against the formulas of include/megadlm/ops/sampling.h,
// evaluated here directly (argmax, float64 Gumbel scores from Philox, softmax probability,
// guidance combined in f32).
#include <gtest/gtest.h>
#include <cmath>
#include <random>
#include "megadlm/core/philox.h"
#include "megadlm/ops/sampling.h"

using namespace megadlm;

namespace {

struct Case {
  int64_t rows = 5, vocab = 37;
  std::vector<float> c, u;
  std::vector<int32_t> keys;
};

Case make_case(uint32_t seed) {
  Case k;
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (int64_t i = 0; i < k.rows * k.vocab; ++i) {
    k.c.push_back(n(gen));
    k.u.push_back(n(gen));
  }
  for (int64_t r = 0; r < k.rows; ++r) {
    k.keys.push_back(static_cast<int32_t>(100 + r));  // sample index
    k.keys.push_back(static_cast<int32_t>(3 * r));    // generated position
  }
  return k;
}

void run(const Case& k, const ops::ProposalArgs& a, bool cfg, std::vector<int32_t>& tok, std::vector<double>& conf) {
  const Stream s = Stream::cpu();
  Tensor c = Tensor::from_floats(k.c, {k.rows, k.vocab});
  Tensor u = cfg ? Tensor::from_floats(k.u, {k.rows, k.vocab}) : Tensor();
  Tensor keys = Tensor::from_ints(k.keys, {k.rows, 2});
  Tensor t = Tensor::empty({k.rows}, DType::I32, s);
  Tensor p = Tensor::empty({k.rows}, DType::F64, s);
  ops::sample_proposals(c, u, keys, a, t, p, s);
  tok.assign(t.data<int32_t>(), t.data<int32_t>() + k.rows);
  conf.assign(p.data<double>(), p.data<double>() + k.rows);
}

double softmax_at(const std::vector<double>& l, int64_t x) {
  double m = -INFINITY, s = 0;
  for (double v : l) m = std::max(m, v);
  for (double v : l) s += std::exp(v - m);
  return std::exp(l[static_cast<size_t>(x)] - m) / s;
}

}  // namespace

TEST(SampleProposals, GreedyIsTheArgmaxWithItsSoftmaxProbability) {
  const Case k = make_case(1);
  std::vector<int32_t> tok;
  std::vector<double> conf;
  run(k, {}, false, tok, conf);
  for (int64_t r = 0; r < k.rows; ++r) {
    std::vector<double> l(k.c.begin() + r * k.vocab, k.c.begin() + (r + 1) * k.vocab);
    const int64_t best = std::max_element(l.begin(), l.end()) - l.begin();
    EXPECT_EQ(tok[static_cast<size_t>(r)], best);
    EXPECT_NEAR(conf[static_cast<size_t>(r)], softmax_at(l, best), 1e-15);
  }
}

TEST(SampleProposals, TemperatureUsesFloat64GumbelScoresFromPhiloxKeyedByCoordinates) {
  const Case k = make_case(2);
  ops::ProposalArgs a;
  a.temperature = 0.8;
  a.seed = 99;
  a.step = 4;
  std::vector<int32_t> tok;
  std::vector<double> conf;
  run(k, a, false, tok, conf);
  const PhiloxKey key = PhiloxKey::make(99, RngPurpose::SamplerGumbel);
  int differs_from_argmax = 0;
  for (int64_t r = 0; r < k.rows; ++r) {
    std::vector<double> l(k.c.begin() + r * k.vocab, k.c.begin() + (r + 1) * k.vocab);
    int64_t best = 0;
    double best_score = -1;
    for (int64_t v = 0; v < k.vocab; ++v) {
      const PhiloxWords w = philox(key, static_cast<uint32_t>(v / 2), static_cast<uint32_t>(3 * r),
                                   static_cast<uint32_t>(100 + r), 4);
      const double u = v % 2 ? uniform53(w.w[2], w.w[3]) : uniform53(w.w[0], w.w[1]);
      const double score = std::exp(l[static_cast<size_t>(v)]) / std::pow(-std::log(u), 0.8);
      if (score > best_score) {
        best_score = score;
        best = v;
      }
    }
    EXPECT_EQ(tok[static_cast<size_t>(r)], best);
    // The confidence is the softmax of the clean logits at the sampled token.
    EXPECT_NEAR(conf[static_cast<size_t>(r)], softmax_at(l, best), 1e-15);
    differs_from_argmax += best != std::max_element(l.begin(), l.end()) - l.begin();
  }
  EXPECT_GT(differs_from_argmax, 0);  // the noise does something at tau 0.8
}

TEST(SampleProposals, GuidanceCombinesInFloat32AndSuppressedTokensAreNeverProposed) {
  const Case k = make_case(3);
  ops::ProposalArgs a;
  a.cfg_scale = 0.7f;
  std::vector<int32_t> tok;
  std::vector<double> conf;
  run(k, a, true, tok, conf);
  std::vector<int32_t> plain_tok;
  std::vector<double> plain_conf;
  for (int64_t r = 0; r < k.rows; ++r) {
    std::vector<double> l;
    for (int64_t v = 0; v < k.vocab; ++v) {
      const float c = k.c[static_cast<size_t>(r * k.vocab + v)], u = k.u[static_cast<size_t>(r * k.vocab + v)];
      const float d = c - u;
      const float e = 1.7f * d;
      l.push_back(static_cast<double>(u + e));
    }
    const int64_t best = std::max_element(l.begin(), l.end()) - l.begin();
    EXPECT_EQ(tok[static_cast<size_t>(r)], best);
    EXPECT_NEAR(conf[static_cast<size_t>(r)], softmax_at(l, best), 1e-15);
  }
  a = {};
  run(k, a, false, plain_tok, plain_conf);
  a.suppress_token = plain_tok[0];
  run(k, a, false, tok, conf);
  EXPECT_NE(tok[0], plain_tok[0]);
  for (int64_t r = 0; r < k.rows; ++r) EXPECT_NE(tok[static_cast<size_t>(r)], plain_tok[0]);
}

TEST(SampleProposals, RandomRemaskingConfidenceIsAPhiloxUniform) {
  const Case k = make_case(4);
  ops::ProposalArgs a;
  a.confidence = ops::ProposalConfidence::Random;
  a.seed = 5;
  a.step = 11;
  std::vector<int32_t> tok;
  std::vector<double> conf;
  run(k, a, false, tok, conf);
  const PhiloxKey key = PhiloxKey::make(5, RngPurpose::SamplerRemask);
  for (int64_t r = 0; r < k.rows; ++r) {
    const PhiloxWords w = philox(key, static_cast<uint32_t>(3 * r), 0, static_cast<uint32_t>(100 + r), 11);
    EXPECT_EQ(conf[static_cast<size_t>(r)], uniform53(w.w[0], w.w[1]));
  }
}
