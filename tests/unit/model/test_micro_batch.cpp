// Unit tests of the context-parallel side of model/micro_batch.h: padding truncated sequences
// so they split over the CP ranks (padding of zero loss weight in a document of its own), and
// the upload of one CP rank's shard (global positions, global loss weights, the split and the
// document views the CP attention reads).
#include <gtest/gtest.h>
#include <vector>
#include "megadlm/model/micro_batch.h"

using namespace megadlm;

namespace {

/// Two samples of `seq` tokens: token 10·b + i, positions i, weight 0.5, label token + 1.
HostMicroBatch two_samples(int64_t seq, bool documents) {
  HostMicroBatch h;
  h.batch = 2;
  h.seq = seq;
  h.first_sample = 6;
  h.loss_tokens = 2.0 * seq;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < seq; ++i) {
      h.input_ids.push_back(static_cast<int32_t>(10 * b + i));
      h.labels.push_back(static_cast<int32_t>(10 * b + i + 1));
      h.loss_weights.push_back(0.5f);
      h.positions.push_back(static_cast<int32_t>(i));
      h.noise_mask.push_back(1);
      if (documents) h.document_ids.push_back(i < 2 ? 0 : 1);
    }
  }
  return h;
}

std::vector<int32_t> ints(const Tensor& t) {
  const Tensor h = t.to(Device::cpu(), Stream::cpu());
  return {h.data<int32_t>(), h.data<int32_t>() + h.numel()};
}

}  // namespace

TEST(MicroBatchContextParallel, PaddingGetsZeroWeightAndADocumentOfItsOwn) {
  const HostMicroBatch p = pad_for_context_parallel(two_samples(5, false), 2);  // 5 -> 8
  ASSERT_EQ(p.seq, 8);
  EXPECT_EQ(p.input_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 0, 0, 10, 11, 12, 13, 14, 0, 0, 0}));
  EXPECT_EQ(p.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(p.document_ids, (std::vector<int32_t>{0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_EQ(p.loss_weights[static_cast<size_t>(b * 8 + i)], i < 5 ? 0.5f : 0.0f);
  EXPECT_EQ(p.loss_tokens, 10.0);  // the normaliser counts real tokens only
}

TEST(MicroBatchContextParallel, PaddingFollowsTheLastDocumentOfEachRow) {
  const HostMicroBatch p = pad_for_context_parallel(two_samples(7, true), 4);  // 7 -> 8
  EXPECT_EQ(p.document_ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 1, 1, 2, 0, 0, 1, 1, 1, 1, 1, 2}));
}

TEST(MicroBatchContextParallel, NothingChangesWhenTheSequenceSplits) {
  const HostMicroBatch h = two_samples(8, false);
  const HostMicroBatch p = pad_for_context_parallel(h, 2);
  EXPECT_EQ(p.seq, 8);
  EXPECT_TRUE(p.document_ids.empty());  // no documents invented when no padding is needed
  EXPECT_EQ(p.input_ids, h.input_ids);
}

TEST(MicroBatchContextParallel, UploadKeepsThisRanksChunksWithGlobalPositions) {
  // seq 5 padded to 8; cp = 2, rank 1 holds chunks 1 and 2: positions 2, 3, 4, 5.
  const MicroBatch mb = MicroBatch::upload(two_samples(5, false), Stream::cpu(), 1, 2);
  EXPECT_EQ(mb.seq, 4);
  EXPECT_EQ(mb.first_sample, 6);
  EXPECT_EQ(mb.loss_tokens, 10.0);
  EXPECT_EQ(ints(mb.input_ids), (std::vector<int32_t>{2, 3, 4, 0, 12, 13, 14, 0}));
  EXPECT_EQ(ints(mb.positions), (std::vector<int32_t>{2, 3, 4, 5, 2, 3, 4, 5}));
  EXPECT_EQ(ints(mb.document_ids), (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 0, 1}));
  const Tensor w = mb.loss_weights.to(Device::cpu(), Stream::cpu());
  EXPECT_EQ(std::vector<float>(w.data<float>(), w.data<float>() + 8),
            (std::vector<float>{0.5f, 0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.5f, 0.0f}));
  ASSERT_NE(mb.cp, nullptr);
  EXPECT_EQ(mb.cp->seq(), 8);
  const ops::ChunkMap m = mb.position_map();
  EXPECT_EQ(m.global(0), 2);
  EXPECT_EQ(m.global(3), 5);
  // Every rank can cut any rank's documents: rank 0 of 2 holds positions 0, 1, 6, 7.
  EXPECT_EQ(ints(*mb.cp->documents(2, 0, Stream::cpu())),
            (std::vector<int32_t>{0, 0, 1, 1, 0, 0, 1, 1}));
}

TEST(MicroBatchContextParallel, UploadWithoutCpIsTheWholeMicroBatch) {
  const MicroBatch mb = MicroBatch::upload(two_samples(5, false), Stream::cpu());
  EXPECT_EQ(mb.seq, 5);
  EXPECT_EQ(mb.cp, nullptr);
  EXPECT_FALSE(mb.document_ids.defined());
  EXPECT_TRUE(mb.position_map().identity());
}

TEST(MicroBatchBlockDiffusion, UploadPromisesOneDocumentRowsToTheAttention) {
  // Doubled rows of L = 4 positions: one document a row in blocks of 2 (the composed attention
  // path's AttentionArgs::block_diffusion_max_block = 2); two documents in a row: no promise.
  HostMicroBatch h = two_samples(8, false);
  const int64_t L = 4;
  h.block_ranges.assign(static_cast<size_t>(2 * 4 * L), 0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t p = 0; p < L; ++p) {
      int32_t* row = h.block_ranges.data() + b * 4 * L;
      row[p] = 0;
      row[L + p] = static_cast<int32_t>(L);
      row[2 * L + p] = static_cast<int32_t>(p / 2 * 2);
      row[3 * L + p] = static_cast<int32_t>(p / 2 * 2 + 2);
    }
  EXPECT_EQ(MicroBatch::upload(h, Stream::cpu()).block_diffusion_max_block, 2);
  int32_t* row1 = h.block_ranges.data() + 4 * L;
  for (int64_t p = 2; p < L; ++p) {  // row 1: documents [0, 2) and [2, 4)
    row1[p] = 2;
    row1[L + p - 2] = 2;
  }
  EXPECT_EQ(MicroBatch::upload(h, Stream::cpu()).block_diffusion_max_block, 0);
}
