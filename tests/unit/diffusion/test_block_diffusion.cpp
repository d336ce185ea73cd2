// Block diffusion's micro-batch (diffusion/forward_process.h): the doubled row [x_t | x_0], one
// noise level per block, the ranges the attention mask reads, and the mask they give.
#include <gtest/gtest.h>
#include <algorithm>
#include <set>
#include <string>
#include "megadlm/diffusion/forward_process.h"
#include "megadlm/ops/attention.h"

using namespace megadlm;

namespace {

std::vector<std::vector<int32_t>> make_samples(int64_t batch, int64_t seq) {
  std::vector<std::vector<int32_t>> s(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i <= seq; ++i) s[static_cast<size_t>(b)].push_back(10 + static_cast<int32_t>(b * 1000 + i));
  return s;
}

DiffusionConfig bd(int64_t block, DlmLossWeight w = DlmLossWeight::InvTEps) {
  DiffusionConfig c;
  c.mask_token = 7;
  c.varilen_prob = 0.0f;
  c.block_size = block;
  c.loss_weight = w;
  return c;
}

// The mask a row's ranges give, as the drawings of docs/training_objectives.md print it.
std::string draw(const HostMicroBatch& mb, int64_t b, bool causal_clean) {
  const int64_t L = mb.seq / 2;
  const int32_t* r = mb.block_ranges.data() + b * 4 * L;
  std::string out;
  for (int64_t i = 0; i < 2 * L; ++i) {
    for (int64_t j = 0; j < 2 * L; ++j) out += ops::block_diffusion_visible(r, L, causal_clean, i, j) ? '#' : '.';
    out += '\n';
  }
  return out;
}

}  // namespace

TEST(BlockDiffusionBatch, RowsAreTheNoisyCopyThenTheCleanCopyAtTheSamePositions) {
  const auto samples = make_samples(2, 16);
  const HostMicroBatch mb = build_micro_batch(samples, 40, bd(4), BatchContext{});
  ASSERT_EQ(mb.seq, 32);
  ASSERT_EQ(mb.block_ranges.size(), 2u * 4 * 16);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 16; ++i) {
      const size_t noisy = static_cast<size_t>(b * 32 + i), clean = noisy + 16;
      const int32_t token = samples[static_cast<size_t>(b)][static_cast<size_t>(i + 1)];
      EXPECT_EQ(mb.input_ids[clean], token);
      EXPECT_EQ(mb.input_ids[noisy], mb.noise_mask[noisy] ? 7 : token);
      EXPECT_EQ(mb.labels[noisy], token);
      EXPECT_EQ(mb.positions[noisy], i);
      EXPECT_EQ(mb.positions[clean], i);
      EXPECT_EQ(mb.loss_weights[clean], 0.0f) << "the clean half carries no loss";
      EXPECT_EQ(mb.noise_mask[clean], 0);
    }
  EXPECT_EQ(mb.loss_tokens, 32.0) << "the normaliser counts the L noisy tokens of each row";
}

TEST(BlockDiffusionBatch, EachBlockDrawsItsOwnNoiseLevelAndWeight) {
  // inv_t_eps: a masked token's weight is 1/p of its block; with 16 blocks of 4 the weights of
  // one row take several values, constant inside each block.
  const HostMicroBatch mb = build_micro_batch(make_samples(1, 64), 0, bd(4), BatchContext{});
  std::set<float> weights;
  for (int64_t blk = 0; blk < 16; ++blk) {
    float w = 0;
    for (int64_t i = blk * 4; i < blk * 4 + 4; ++i) {
      const float wi = mb.loss_weights[static_cast<size_t>(i)];
      if (wi == 0) continue;
      if (w != 0) EXPECT_FLOAT_EQ(wi, w) << "block " << blk;
      w = wi;
      EXPECT_GE(wi, 1.0f);
      EXPECT_LE(wi, 1000.0f);
    }
    if (w != 0) weights.insert(w);
  }
  EXPECT_GE(weights.size(), 5u) << "per-block noise levels";
  // One level per sequence: every masked token of the row has the same weight.
  DiffusionConfig seq_t = bd(4);
  seq_t.t_granularity = BlockTimeGranularity::Sequence;
  const HostMicroBatch one = build_micro_batch(make_samples(1, 64), 0, seq_t, BatchContext{});
  std::set<float> w1;
  for (int64_t i = 0; i < 64; ++i)
    if (one.loss_weights[static_cast<size_t>(i)] != 0) w1.insert(one.loss_weights[static_cast<size_t>(i)]);
  EXPECT_EQ(w1.size(), 1u);
}

TEST(BlockDiffusionBatch, ASampleIsNoisedTheSameInAnyMicroBatch) {
  const auto samples = make_samples(4, 16);
  const HostMicroBatch all = build_micro_batch(samples, 100, bd(4), BatchContext{});
  const HostMicroBatch third = build_micro_batch({samples[2]}, 102, bd(4), BatchContext{});
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_EQ(all.input_ids[static_cast<size_t>(64 + i)], third.input_ids[static_cast<size_t>(i)]);
    EXPECT_EQ(all.loss_weights[static_cast<size_t>(64 + i)], third.loss_weights[static_cast<size_t>(i)]);
  }
  for (int64_t i = 0; i < 64; ++i)
    EXPECT_EQ(all.block_ranges[static_cast<size_t>(2 * 64 + i)], third.block_ranges[static_cast<size_t>(i)]);
}

TEST(BlockDiffusionBatch, TheMaskOfEightTokensInBlocksOfFourIsTheDrawnOne) {
  const HostMicroBatch mb = build_micro_batch(make_samples(1, 8), 0, bd(4), BatchContext{});
  // docs/training_objectives.md: rows are queries, columns keys; x_t 0..7 then x_0 8..15.
  const std::string bd3 =
      "####............\n" "####............\n" "####............\n" "####............\n"
      "....########....\n" "....########....\n" "....########....\n" "....########....\n"
      "........####....\n" "........####....\n" "........####....\n" "........####....\n"
      "........########\n" "........########\n" "........########\n" "........########\n";
  const std::string causal =
      "####............\n" "####............\n" "####............\n" "####............\n"
      "....########....\n" "....########....\n" "....########....\n" "....########....\n"
      "........#.......\n" "........##......\n" "........###.....\n" "........####....\n"
      "........#####...\n" "........######..\n" "........#######.\n" "........########\n";
  EXPECT_EQ(draw(mb, 0, false), bd3);
  EXPECT_EQ(draw(mb, 0, true), causal);
  // Visible pairs: L·B + L² = 96 and L² + L·B/2 + L/2 = 84 (the FLOP count's).
  EXPECT_EQ(std::count(bd3.begin(), bd3.end(), '#'), 96);
  EXPECT_EQ(std::count(causal.begin(), causal.end(), '#'), 84);
}

TEST(BlockDiffusionBatch, BlocksRestartAtEveryDocumentWithPerDocumentAttention) {
  // Clean tokens w_1..w_12 with an EOD (id 3) at position 4: documents [0, 5) and [5, 12).
  std::vector<int32_t> s = {9, 20, 21, 22, 23, 3, 30, 31, 32, 33, 34, 35, 36};
  BatchContext ctx;
  ctx.eod_token = 3;
  ctx.per_document_attention = true;
  ctx.reset_position_ids = true;
  const HostMicroBatch mb = build_micro_batch({s}, 0, bd(4), ctx);
  const int64_t L = 12;
  const int32_t* r = mb.block_ranges.data();
  const int32_t doc_start[] = {0, 0, 0, 0, 0, 5, 5, 5, 5, 5, 5, 5};
  const int32_t doc_end[] = {5, 5, 5, 5, 5, 12, 12, 12, 12, 12, 12, 12};
  const int32_t block_start[] = {0, 0, 0, 0, 4, 5, 5, 5, 5, 9, 9, 9};
  const int32_t block_end[] = {4, 4, 4, 4, 5, 9, 9, 9, 9, 12, 12, 12};
  for (int64_t p = 0; p < L; ++p) {
    EXPECT_EQ(r[p], doc_start[p]) << p;
    EXPECT_EQ(r[L + p], doc_end[p]) << p;
    EXPECT_EQ(r[2 * L + p], block_start[p]) << p;
    EXPECT_EQ(r[3 * L + p], block_end[p]) << p;
    EXPECT_EQ(mb.positions[static_cast<size_t>(p)], p < 5 ? p : p - 5);
    EXPECT_EQ(mb.positions[static_cast<size_t>(L + p)], p < 5 ? p : p - 5);
  }
  // No attention across the documents in either half.
  for (int64_t i = 0; i < 2 * L; ++i)
    for (int64_t j = 0; j < 2 * L; ++j)
      if ((i % L < 5) != (j % L < 5)) EXPECT_FALSE(ops::block_diffusion_visible(r, L, false, i, j)) << i << "," << j;
  // Without per-document attention the row is one document: blocks at multiples of B.
  ctx.per_document_attention = false;
  const HostMicroBatch whole = build_micro_batch({s}, 0, bd(4), ctx);
  EXPECT_EQ(whole.block_ranges[2 * L + 5], 4);
  EXPECT_EQ(whole.block_ranges[L + 0], 12);
}

TEST(BlockDiffusionBatch, TheCausalVariantAlsoScoresTheNextTokenOnTheCleanHalf) {
  DiffusionConfig c = bd(4);
  c.ar_loss_weight = 1.0f;
  c.diffusion_loss_scale = 0.3f;
  const auto samples = make_samples(1, 8);
  const HostMicroBatch mb = build_micro_batch(samples, 3, c, BatchContext{});
  const HostMicroBatch plain = build_micro_batch(samples, 3, bd(4), BatchContext{});
  int64_t masked = 0;
  for (int64_t i = 0; i < 8; ++i) {
    const size_t noisy = static_cast<size_t>(i), copy = static_cast<size_t>(8 + i);
    masked += mb.noise_mask[noisy];
    EXPECT_FLOAT_EQ(mb.loss_weights[noisy], 0.3f * plain.loss_weights[noisy]) << "the diffusion term's scale";
    EXPECT_EQ(mb.input_ids[noisy], plain.input_ids[noisy]) << "the same noise";
    if (i + 1 < 8) {
      EXPECT_EQ(mb.labels[copy], samples[0][static_cast<size_t>(i + 2)]) << "clean position i predicts token i + 1";
      EXPECT_FLOAT_EQ(mb.loss_weights[copy], 1.0f);
    } else {
      EXPECT_EQ(mb.loss_weights[copy], 0.0f) << "no token after the row's last";
    }
  }
  EXPECT_EQ(mb.loss_tokens, static_cast<double>(masked + 7)) << "normaliser: masked + next-token positions";
}

TEST(BlockDiffusionBatch, TheFullSequenceObjectiveIsUnchanged) {
  // block_size 0: the same micro-batch as before block diffusion existed (no ranges, seq L).
  DiffusionConfig c = bd(0, DlmLossWeight::ExactRatio);
  const HostMicroBatch mb = build_micro_batch(make_samples(2, 16), 5, c, BatchContext{});
  EXPECT_EQ(mb.seq, 16);
  EXPECT_TRUE(mb.block_ranges.empty());
  int64_t masked = 0;
  for (uint8_t m : mb.noise_mask) masked += m;
  EXPECT_GT(masked, 0);
}

// The block-size warm-up changes only the micro-batch: at each iteration the rows hold the
// schedule's blocks. Independent reference: block j of size B spans [B*floor(j/B), +B).
TEST(BlockDiffusionBatch, TheWarmUpScheduleSetsEachIterationsBlocks) {
  DiffusionConfig c = bd(8);
  c.block_size_schedule = {{1, 3}, {2, 5}, {4, 9}};
  const int64_t L = 16;
  const auto samples = make_samples(1, L);
  const int64_t want[] = {1, 1, 1, 2, 2, 4, 4, 4, 4, 8, 8};
  for (int64_t it = 0; it < 11; ++it) {
    DiffusionConfig at = c;
    at.block_size = c.block_size_at(it);
    ASSERT_EQ(at.block_size, want[it]) << "iteration " << it;
    const HostMicroBatch mb = build_micro_batch(samples, 0, at, BatchContext{});
    for (int64_t j = 0; j < L; ++j) {
      EXPECT_EQ(mb.block_ranges[static_cast<size_t>(2 * L + j)], j / want[it] * want[it]) << it << " " << j;
      EXPECT_EQ(mb.block_ranges[static_cast<size_t>(3 * L + j)], j / want[it] * want[it] + want[it]) << it << " " << j;
    }
  }
}
