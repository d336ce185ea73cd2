// Synthetic data in the spirit of Megatron's MockGPTDataset: documents of pseudo-random length
// in [1, 4095] whose tokens count up from 1 and end with EOD, concatenated in order; sample i is
// the S+1 tokens starting at stream position i*S (consecutive samples share one token, as
// Megatron's GPT samples do). Deterministic under the seed, any number of samples, learnable
// (a masked token follows from its neighbours), so "the loss falls" is a meaningful check.
//
// Token ids: EOD is 0; the count k >= 1 maps onto the ids [1, vocab) skipping `mask_token`,
// wrapping around when k exceeds the available ids.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>
#include "megadlm/data/sample_source.h"

namespace megadlm {

class MockGptDataset final : public SampleSource {
 public:
  static constexpr int32_t kEod = 0;
  MockGptDataset(int64_t vocab_size, int64_t seq_length, int64_t mask_token, uint64_t seed = 0);

  /// The S+1 tokens of sample `index` (any index >= 0).
  std::vector<int32_t> sample(int64_t index) const override;
  int32_t eod_token() const override { return kEod; }
  int64_t seq_length() const { return seq_length_; }

 private:
  int64_t document_length(int64_t doc) const;
  int32_t token_of_count(int64_t k) const;
  int32_t token_at(int64_t position) const;  // token at stream position

  int64_t vocab_size_, seq_length_, mask_token_;
  uint64_t seed_;
  int64_t num_ids_;  // ids available for content
  mutable std::mutex mu_;
  mutable std::vector<int64_t> doc_starts_{0};  // prefix sums of document lengths, grown lazily
};

}  // namespace megadlm
