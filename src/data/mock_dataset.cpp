#include "megadlm/data/mock_dataset.h"
#include <algorithm>
#include "megadlm/core/error.h"
#include "megadlm/core/philox.h"

namespace megadlm {

MockGptDataset::MockGptDataset(int64_t vocab_size, int64_t seq_length, int64_t mask_token,
                               uint64_t seed)
    : vocab_size_(vocab_size), seq_length_(seq_length), mask_token_(mask_token), seed_(seed) {
  MDLM_CHECK(vocab_size >= 3, "mock data needs a vocabulary of at least 3 tokens, got ", vocab_size);
  MDLM_CHECK(seq_length >= 1, "mock data needs --seq-length >= 1");
  num_ids_ = vocab_size - 1 - ((mask_token >= 1 && mask_token < vocab_size) ? 1 : 0);
}

int64_t MockGptDataset::document_length(int64_t doc) const {
  PhiloxWords w = philox(PhiloxKey::make(seed_, RngPurpose::MockData), static_cast<uint32_t>(doc),
                         static_cast<uint32_t>(static_cast<uint64_t>(doc) >> 32), 0x6d6f636b, 0);
  return 1 + static_cast<int64_t>(w.w[0] % 4095u);
}

int32_t MockGptDataset::token_of_count(int64_t k) const {
  int64_t id = 1 + (k - 1) % num_ids_;
  if (mask_token_ >= 1 && id >= mask_token_) ++id;  // never emit the mask token
  return static_cast<int32_t>(id);
}

int32_t MockGptDataset::token_at(int64_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  while (doc_starts_.back() <= position) {
    const int64_t doc = static_cast<int64_t>(doc_starts_.size()) - 1;
    doc_starts_.push_back(doc_starts_.back() + document_length(doc));
  }
  // doc d covers [starts[d], starts[d+1]); its last token is EOD.
  auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), position);
  const int64_t doc = (it - doc_starts_.begin()) - 1;
  const int64_t start = doc_starts_[static_cast<size_t>(doc)];
  const int64_t end = doc_starts_[static_cast<size_t>(doc) + 1];
  if (position == end - 1) return kEod;
  return token_of_count(position - start + 1);
}

std::vector<int32_t> MockGptDataset::sample(int64_t index) const {
  MDLM_CHECK(index >= 0, "negative sample index ", index);
  std::vector<int32_t> out(static_cast<size_t>(seq_length_ + 1));
  const int64_t base = index * seq_length_;
  for (int64_t i = 0; i <= seq_length_; ++i) out[static_cast<size_t>(i)] = token_at(base + i);
  return out;
}

}  // namespace megadlm
