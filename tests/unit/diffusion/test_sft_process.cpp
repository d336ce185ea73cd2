// Supervised fine-tuning noise: the prompt is never masked, the response is masked at LLaDA's
// rate p = (1 - 1e-3) t + 1e-3 with t recomputed here from Philox, and the two loss
// normalisations give the weights and normalisers of LLaDA's SFT recipe (docs/finetuning.md).
#include <gtest/gtest.h>
#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include "megadlm/core/philox.h"
#include "megadlm/diffusion/sft_process.h"

using namespace megadlm;

namespace {

// One hand-made case of tests/golden/bd_sft_reference.py (block-diffusion SFT).
struct BdSftGolden {
  const char* name;
  int64_t seq, block;
  int per_block, token_norm;
  float ar_weight, diffusion_scale;
  uint64_t seed;
  int64_t first_sample;
  int training;
  int64_t rows;
  const int32_t* samples;
  const int64_t* prompts;
  const int32_t* input_ids;
  const int32_t* labels;
  const float* weights;
  const int32_t* ranges;
  double loss_tokens;
};
#include "golden/bd_sft_reference.inc"

std::vector<std::vector<int32_t>> samples(int64_t batch, int64_t seq) {
  std::vector<std::vector<int32_t>> s(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i <= seq; ++i) s[static_cast<size_t>(b)].push_back(static_cast<int32_t>(1 + (b * 7 + i) % 50));
  return s;
}

double p_of(uint64_t seed, int64_t g) {
  const float t = uniform_from_u32(philox(PhiloxKey::make(seed, RngPurpose::DiffusionTime), 0, 0,
                                          static_cast<uint32_t>(g), 0).w[0]);
  return (1.0 - 1e-3) * t + 1e-3;
}

}  // namespace

TEST(SftProcess, PromptTokensAreNeverMaskedAndResponsesCarryLladasWeight) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  cfg.sft = true;
  BatchContext ctx;
  ctx.seed = 17;
  const int64_t seq = 24, batch = 64;
  std::vector<int64_t> prompts;
  for (int64_t b = 0; b < batch; ++b) prompts.push_back(b % 20);
  const auto s = samples(batch, seq);
  const HostMicroBatch mb = build_sft_micro_batch(s, prompts, 1000, cfg, ctx);
  ASSERT_EQ(mb.seq, seq);
  EXPECT_EQ(mb.loss_tokens, static_cast<double>(batch));  // answer_len: one per sample
  int64_t masked_total = 0;
  double expected_total = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const double p = p_of(17, 1000 + b);
    const int64_t answer = seq - prompts[static_cast<size_t>(b)];
    expected_total += p * static_cast<double>(answer);
    for (int64_t i = 0; i < seq; ++i) {
      const size_t k = static_cast<size_t>(b * seq + i);
      EXPECT_EQ(mb.labels[k], s[static_cast<size_t>(b)][static_cast<size_t>(i + 1)]);
      EXPECT_EQ(mb.positions[k], i);
      if (i < prompts[static_cast<size_t>(b)]) {
        ASSERT_EQ(mb.noise_mask[k], 0) << "prompt token " << i << " of sample " << b << " was masked";
        EXPECT_EQ(mb.input_ids[k], mb.labels[k]);
        EXPECT_EQ(mb.loss_weights[k], 0.0f);
      } else if (mb.noise_mask[k]) {
        ++masked_total;
        EXPECT_EQ(mb.input_ids[k], 99);
        EXPECT_FLOAT_EQ(mb.loss_weights[k], static_cast<float>(1.0 / (p * static_cast<double>(answer))));
      } else {
        EXPECT_EQ(mb.loss_weights[k], 0.0f);
      }
    }
  }
  // Bernoulli(p_b) per response token: the count is near its expectation (sd ~ sqrt(total/4)).
  EXPECT_NEAR(static_cast<double>(masked_total), expected_total, 4 * std::sqrt(expected_total));
}

TEST(SftProcess, TokenNormalisationWeighsByOneOverPAndCountsAnswerTokens) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  cfg.sft = true;
  cfg.sft_loss_norm = SftLossNorm::Token;
  BatchContext ctx;
  ctx.seed = 3;
  const HostMicroBatch mb = build_sft_micro_batch(samples(2, 10), {3, 9}, 0, cfg, ctx);
  EXPECT_EQ(mb.loss_tokens, 7.0 + 1.0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 10; ++i) {
      const size_t k = static_cast<size_t>(b * 10 + i);
      if (mb.noise_mask[k]) {
        EXPECT_FLOAT_EQ(mb.loss_weights[k], static_cast<float>(1.0 / p_of(3, b)));
      }
    }
}

TEST(SftProcess, EvaluationNoiseIsFixedAndApartFromTraining) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  BatchContext train, eval;
  train.seed = eval.seed = 5;
  eval.training = false;
  const auto s = samples(8, 32);
  const std::vector<int64_t> p(8, 4);
  const HostMicroBatch a = build_sft_micro_batch(s, p, 0, cfg, eval), b = build_sft_micro_batch(s, p, 0, cfg, eval);
  const HostMicroBatch t = build_sft_micro_batch(s, p, 0, cfg, train);
  EXPECT_EQ(a.noise_mask, b.noise_mask);
  EXPECT_NE(a.noise_mask, t.noise_mask);
}

TEST(SftProcess, RejectsAPromptThatLeavesNoResponse) {
  DiffusionConfig cfg;
  EXPECT_THROW(build_sft_micro_batch(samples(1, 8), {8}, 0, cfg, BatchContext{}), Error);
}

// ----------------------------------------------------------------------------- block diffusion

namespace {

DiffusionConfig block_sft_config(int64_t block) {
  DiffusionConfig cfg;
  cfg.mask_token = 99;
  cfg.sft = true;
  cfg.block_size = block;
  return cfg;
}

// p of block k of sample g, recomputed from Philox (training streams).
double block_p(uint64_t seed, int64_t k, int64_t g) {
  const float t = uniform_from_u32(philox(PhiloxKey::make(seed, RngPurpose::DiffusionTime), static_cast<uint32_t>(k),
                                          0, static_cast<uint32_t>(g), 0).w[0]);
  return (1.0 - 1e-3) * t + 1e-3;
}

std::filesystem::path source_root() { return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / ".."; }

}  // namespace

// The micro-batch equals, element for element, what the independent reference script computes
// from the documented rule on hand-made rows: per-block and per-row t, both normalisations, the
// causal clean half's next-token targets (a prompt of 0 and of L - 2 tokens), evaluation noise.
TEST(BlockSftProcess, MatchesTheReferenceScriptOnHandMadeRows) {
  for (const BdSftGolden& c : kBdSftGolden) {
    SCOPED_TRACE(c.name);
    DiffusionConfig cfg = block_sft_config(c.block);
    cfg.t_granularity = c.per_block ? BlockTimeGranularity::Block : BlockTimeGranularity::Sequence;
    cfg.sft_loss_norm = c.token_norm ? SftLossNorm::Token : SftLossNorm::AnswerLength;
    cfg.ar_loss_weight = c.ar_weight;
    if (c.ar_weight > 0) cfg.diffusion_loss_scale = c.diffusion_scale;
    BatchContext ctx;
    ctx.seed = c.seed;
    ctx.training = c.training != 0;
    std::vector<std::vector<int32_t>> rows;
    std::vector<int64_t> prompts;
    for (int64_t b = 0; b < c.rows; ++b) {
      rows.emplace_back(c.samples + b * (c.seq + 1), c.samples + (b + 1) * (c.seq + 1));
      prompts.push_back(c.prompts[b]);
    }
    const HostMicroBatch mb = build_sft_micro_batch(rows, prompts, c.first_sample, cfg, ctx);
    ASSERT_EQ(mb.seq, 2 * c.seq);
    ASSERT_EQ(mb.input_ids.size(), static_cast<size_t>(c.rows * 2 * c.seq));
    ASSERT_EQ(mb.block_ranges.size(), static_cast<size_t>(c.rows * 4 * c.seq));
    EXPECT_DOUBLE_EQ(mb.loss_tokens, c.loss_tokens);
    for (size_t k = 0; k < mb.input_ids.size(); ++k) {
      EXPECT_EQ(mb.input_ids[k], c.input_ids[k]) << "token " << k;
      EXPECT_EQ(mb.labels[k], c.labels[k]) << "token " << k;
      EXPECT_FLOAT_EQ(mb.loss_weights[k], c.weights[k]) << "token " << k;
      EXPECT_EQ(mb.positions[k], static_cast<int32_t>(static_cast<int64_t>(k) % c.seq)) << "token " << k;
      EXPECT_EQ(mb.noise_mask[k], c.input_ids[k] == 99 ? 1 : 0) << "token " << k;
    }
    for (size_t k = 0; k < mb.block_ranges.size(); ++k) EXPECT_EQ(mb.block_ranges[k], c.ranges[k]) << "range " << k;
  }
}

// The checked-in table is what the reference script prints today (python3 needed; no numpy).
TEST(BlockSftProcess, GoldenTableMatchesItsScript) {
  const std::filesystem::path root = source_root();
  const std::filesystem::path script = root / "tests" / "golden" / "bd_sft_reference.py";
  const std::filesystem::path inc = root / "tests" / "golden" / "bd_sft_reference.inc";
  if (std::system("python3 -c 'import struct' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 not found: the golden table is not regenerated";
  const std::filesystem::path out =
      std::filesystem::temp_directory_path() / ("bd_sft_reference_" + std::to_string(::getpid()) + ".inc");
  const std::string cmd = "python3 '" + script.string() + "' > '" + out.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string fresh = slurp(out), committed = slurp(inc);
  std::filesystem::remove(out);
  EXPECT_FALSE(fresh.empty());
  EXPECT_TRUE(fresh == committed) << "tests/golden/bd_sft_reference.inc differs from what "
                                     "tests/golden/bd_sft_reference.py prints; regenerate it";
}

// Over many rows: no prompt token is ever masked, every masked response token weighs
// 1 / (p_k * answer length) with p_k recomputed here for its own block, the clean half is never
// scored, and the masked count is near its expectation sum_k p_k * (response tokens of block k).
TEST(BlockSftProcess, PromptsStayCleanAndEachResponseBlockHasItsOwnRate) {
  const DiffusionConfig cfg = block_sft_config(4);
  BatchContext ctx;
  ctx.seed = 23;
  const int64_t seq = 24, batch = 64, first = 500;
  std::vector<int64_t> prompts;
  for (int64_t b = 0; b < batch; ++b) prompts.push_back((b * 5) % 23);
  const auto s = samples(batch, seq);
  const HostMicroBatch mb = build_sft_micro_batch(s, prompts, first, cfg, ctx);
  ASSERT_EQ(mb.seq, 2 * seq);
  EXPECT_EQ(mb.loss_tokens, static_cast<double>(batch));
  int64_t masked_total = 0;
  double expected_total = 0;
  std::vector<double> block_weights;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t prompt = prompts[static_cast<size_t>(b)], answer = seq - prompt;
    for (int64_t i = 0; i < seq; ++i) {
      const size_t noisy = static_cast<size_t>(b * 2 * seq + i), copy = noisy + static_cast<size_t>(seq);
      const double p = block_p(23, i / 4, first + b);
      EXPECT_EQ(mb.input_ids[copy], s[static_cast<size_t>(b)][static_cast<size_t>(i + 1)]);
      EXPECT_EQ(mb.loss_weights[copy], 0.0f);
      if (i < prompt) {
        ASSERT_EQ(mb.noise_mask[noisy], 0) << "prompt token " << i << " of sample " << b << " was masked";
        EXPECT_EQ(mb.loss_weights[noisy], 0.0f);
        continue;
      }
      expected_total += p;
      if (mb.noise_mask[noisy]) {
        ++masked_total;
        EXPECT_EQ(mb.input_ids[noisy], 99);
        EXPECT_FLOAT_EQ(mb.loss_weights[noisy], static_cast<float>(1.0 / (p * static_cast<double>(answer))));
      } else {
        EXPECT_EQ(mb.input_ids[noisy], mb.input_ids[copy]);
        EXPECT_EQ(mb.loss_weights[noisy], 0.0f);
      }
    }
  }
  EXPECT_NEAR(static_cast<double>(masked_total), expected_total, 4 * std::sqrt(expected_total));
}

// With one t per row the noisy half is exactly the full-sequence SFT micro-batch (same t, same
// mask uniforms, same weights, same normaliser), for both normalisations.
TEST(BlockSftProcess, OneNoiseLevelPerRowReproducesFullSequenceSft) {
  for (SftLossNorm norm : {SftLossNorm::AnswerLength, SftLossNorm::Token}) {
    DiffusionConfig full = block_sft_config(0);
    full.sft_loss_norm = norm;
    DiffusionConfig block = block_sft_config(4);
    block.sft_loss_norm = norm;
    block.t_granularity = BlockTimeGranularity::Sequence;
    BatchContext ctx;
    ctx.seed = 9;
    const int64_t seq = 16, batch = 12;
    std::vector<int64_t> prompts;
    for (int64_t b = 0; b < batch; ++b) prompts.push_back(b % 15);
    const auto s = samples(batch, seq);
    const HostMicroBatch a = build_sft_micro_batch(s, prompts, 77, full, ctx);
    const HostMicroBatch bd = build_sft_micro_batch(s, prompts, 77, block, ctx);
    EXPECT_DOUBLE_EQ(a.loss_tokens, bd.loss_tokens);
    int64_t masked = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < seq; ++i) {
        const size_t k = static_cast<size_t>(b * seq + i), n = static_cast<size_t>(b * 2 * seq + i);
        EXPECT_EQ(bd.input_ids[n], a.input_ids[k]);
        EXPECT_EQ(bd.loss_weights[n], a.loss_weights[k]);
        masked += a.noise_mask[k];
      }
    EXPECT_GT(masked, 0);
  }
}

// A sample is noised the same whatever micro-batch holds it (the layouts' promise): sample
// first + 3 built alone equals row 3 of a micro-batch of 6.
TEST(BlockSftProcess, ASampleIsNoisedTheSameInAnyMicroBatch) {
  const DiffusionConfig cfg = block_sft_config(2);
  BatchContext ctx;
  ctx.seed = 4;
  const auto s = samples(6, 8);
  const std::vector<int64_t> prompts{1, 2, 3, 4, 5, 6};
  const HostMicroBatch all = build_sft_micro_batch(s, prompts, 30, cfg, ctx);
  const HostMicroBatch one = build_sft_micro_batch({s[3]}, {prompts[3]}, 33, cfg, ctx);
  const auto row = [](const auto& v, size_t r, size_t len) { return std::vector(v.begin() + r * len, v.begin() + (r + 1) * len); };
  EXPECT_EQ(row(all.input_ids, 3, 16), one.input_ids);
  EXPECT_EQ(row(all.loss_weights, 3, 16), one.loss_weights);
  EXPECT_EQ(row(all.block_ranges, 3, 32), one.block_ranges);
}

TEST(BlockSftProcess, RejectsABlockSizeThatDoesNotDivideTheSequence) {
  EXPECT_THROW(build_sft_micro_batch(samples(1, 10), {2}, 0, block_sft_config(4), BatchContext{}), Error);
}
