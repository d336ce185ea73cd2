// Where training samples come from: anything that returns the S+1 tokens of the sample at a
// global index (dataset order). Mock data now; Megatron indexed datasets implement the same.
#pragma once
#include <cstdint>
#include <vector>

namespace megadlm {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  /// The seq_length + 1 tokens of sample `index` (Megatron's GPT sample).
  virtual std::vector<int32_t> sample(int64_t index) const = 0;
  /// End-of-document token id (for --eod-mask-loss), or -1.
  virtual int32_t eod_token() const = 0;
  /// Number of samples available, or -1 when any index works (mock data).
  virtual int64_t num_samples() const { return -1; }
  /// Supervised fine-tuning data: tokens of sample `index`'s prompt, counted in the model's input
  /// (tokens 1..S of the sample); 0 for pre-training data (data/sft_dataset.h).
  virtual int64_t prompt_length(int64_t index) const { return 0; }
};

}  // namespace megadlm
