// Megatron's GPT sample construction over indexed datasets, its train/valid/test split and its
// blending, reproduced index for index (same seed => same samples in the same order as
// Megatron-Core's GPTDataset / BlendedDataset), with an on-disk cache of the indices.
//
// For one dataset and one split (a range of its sequences; Megatron calls them documents here):
//   epochs E  = smallest E with E * tokens(split) >= num_samples * S + 1   (1 when unrequested)
//   document index: the split's sequence ids repeated E times, shuffled together by numpy's
//     RandomState(seed).shuffle; when the last epoch would contribute < 80% of an epoch's
//     samples it is shuffled separately and appended ("separate final epoch")
//   sample k covers stream positions [k*S, k*S + S] of the documents concatenated in that
//     order (S + 1 tokens: consecutive samples share one token); the sample index stores the
//     (document-index entry, offset) of each k*S; (E * tokens - 1) / S samples exist
//   shuffle index: a RandomState permutation of the samples (two ranges with a separate final
//     epoch); sample i of the dataset is sample shuffle[i] of the stream.
// Blending (`--data-path 0.3 A 0.7 B`): dataset b gets ceil(size * w_b * 1.005) samples of its
// split; blended sample i comes from the dataset whose share lags its weight most (greedy, as
// Megatron's helpers do). Unweighted blends weigh each dataset by its sample count.
// docs/data.md explains the format, the cache and the split arithmetic.
#pragma once
#include <array>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>
#include "megadlm/data/indexed_dataset.h"
#include "megadlm/data/sample_source.h"

namespace megadlm::data {

enum class Split : int { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split s);  ///< "train", "valid", "test" (Megatron's names)

/// numpy's legacy RandomState(seed) for the two calls the dataset code makes: the MT19937
/// stream (std::mt19937 seeds identically) and shuffle() of a 1-D array (Fisher-Yates from the
/// end, index drawn by masked rejection on 32-bit words, 64-bit words for bounds >= 2^32).
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}
  /// Uniform integer in [0, max] (numpy's random_interval).
  uint64_t interval(uint64_t max);
  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size(); i-- > 1;) std::swap(x[i], x[static_cast<size_t>(interval(i))]);
  }

 private:
  std::mt19937 mt_;
};

/// `--split "969, 30, 1"` as Megatron reads it: the numbers in the string, padded with zeros to
/// three, normalised; each split is a [begin, end) fraction of the sequences or empty.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix parse_split(const std::string& split);

/// A blend as the flags give it: `P`, `P1 P2 ...` (weights by size) or `W1 P1 W2 P2 ...`.
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  ///< empty: weigh by dataset size
};
/// Parses a blend list; throws naming `flag` when the weights do not parse or pair up.
Blend parse_blend(const std::vector<std::string>& values, const std::string& flag);

/// `--data-args-path FILE`: the list `--data-path` would take, read from the file (its whole
/// content split on whitespace, as Megatron reads it). Throws naming the flag and the file when
/// the file cannot be read or holds nothing.
std::vector<std::string> read_data_args_file(const std::string& path);

/// `--per-split-data-args-path FILE`: the lists `--train/valid/test-data-path` would take, read
/// from a JSON object with the keys "train", "valid" and "test" (Megatron requires all three).
/// Each value is a list (prefixes as strings, weights as strings or numbers) or one string split
/// on whitespace; null leaves a split without data (the training split needs one). Other keys
/// are ignored, as Megatron does. Throws naming the flag, the file and the key otherwise.
std::array<std::optional<std::vector<std::string>>, 3> read_per_split_data_args_file(
    const std::string& path);

struct GptDatasetOptions {
  int64_t seq_length = 0;              ///< S; samples have S + 1 tokens
  uint32_t seed = 1234;                ///< --seed (Megatron's random_seed)
  int64_t vocab_size = 0;              ///< every token of a sample must lie below it (0: no check)
  int32_t eod_token = -1;              ///< reported by eod_token()
  std::string cache_dir;               ///< --data-cache-path ("" = build in memory every time)
  bool write_cache = true;             ///< false on ranks that only read the cache
  bool renormalize_blend_weights = false;
  std::ostream* log = nullptr;         ///< build / cache messages (rank 0)
};

/// One dataset's split: the GPT samples described at the top of this file.
class GptDataset final : public SampleSource {
 public:
  /// Sequences [begin, end) of `data` form the split; `num_samples` requested (nullopt: one
  /// epoch, Megatron's None).
  GptDataset(std::shared_ptr<const IndexedDataset> data, Split split, int64_t begin, int64_t end,
             std::optional<int64_t> num_samples, const GptDatasetOptions& options);

  std::vector<int32_t> sample(int64_t index) const override;
  int32_t eod_token() const override { return options_.eod_token; }
  int64_t num_samples() const override { return size(); }
  int64_t size() const { return static_cast<int64_t>(shuffle_index_.size()); }
  int64_t num_epochs() const { return num_epochs_; }
  bool loaded_from_cache() const { return from_cache_; }
  const IndexedDataset& indexed() const { return *data_; }
  Split split() const { return split_; }

  // The three indices, for tests and tools.
  const std::vector<int32_t>& document_index() const { return document_index_; }
  /// [num samples + 1][2]: (document-index entry, token offset) of each sample start.
  const std::vector<int64_t>& sample_index() const { return sample_index_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }

 private:
  void build();
  /// Indices read from --data-cache-path checked against the data: nullopt when they are what
  /// build() could have made, else the damaged file's name (after the cache prefix) and why.
  std::optional<std::pair<std::string, std::string>> check_indices(int64_t built) const;
  std::string description() const;

  std::shared_ptr<const IndexedDataset> data_;
  Split split_;
  int64_t begin_, end_;
  std::optional<int64_t> num_samples_;
  GptDatasetOptions options_;
  int64_t num_epochs_ = 1;
  bool from_cache_ = false;
  std::vector<int32_t> document_index_;
  std::vector<int64_t> sample_index_;
  std::vector<int64_t> shuffle_index_;
};

/// Several datasets' splits mixed by weight (Megatron's BlendedDataset).
class BlendedDataset final : public SampleSource {
 public:
  /// `weights` need not be normalised. `size` samples are drawn.
  BlendedDataset(std::vector<std::shared_ptr<const GptDataset>> datasets,
                 std::vector<double> weights, int64_t size, const GptDatasetOptions& options);

  std::vector<int32_t> sample(int64_t index) const override;
  int32_t eod_token() const override { return options_.eod_token; }
  int64_t num_samples() const override { return size(); }
  int64_t size() const { return static_cast<int64_t>(dataset_index_.size()); }
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }

 private:
  std::vector<std::shared_ptr<const GptDataset>> datasets_;
  std::vector<double> weights_;
  GptDatasetOptions options_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

/// Megatron's greedy blending: sample i goes to the dataset maximising
/// w_d * max(i, 1) - count_d (first on ties). Weights must be normalised.
void build_blending_indices(const std::vector<double>& weights, int64_t size,
                            std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);

/// Where the data of each split comes from: one blend cut by --split, or one blend per split.
struct DataSources {
  std::optional<Blend> blend;                    ///< --data-path
  std::string split = "969, 30, 1";              ///< --split (with blend)
  std::array<std::optional<Blend>, 3> per_split; ///< --train/valid/test-data-path
};

/// One dataset per split (null when the split is empty or was not asked for).
struct SplitDatasets {
  std::array<std::shared_ptr<const SampleSource>, 3> splits;
  std::shared_ptr<const SampleSource> train() const { return splits[0]; }
  std::shared_ptr<const SampleSource> valid() const { return splits[1]; }
  std::shared_ptr<const SampleSource> test() const { return splits[2]; }
};

/// Builds the splits as Megatron's BlendedMegatronDatasetBuilder does. `num_samples[s]` is the
/// number of samples split s must provide (nullopt: skip the split). Opening the datasets
/// validates their files (errors name the file); with a vocabulary, each .bin is scanned for
/// token ids outside it (the first 4 GiB of each file; every sample is checked when read).
SplitDatasets build_gpt_datasets(const DataSources& sources,
                                 const std::array<std::optional<int64_t>, 3>& num_samples,
                                 const GptDatasetOptions& options);

}  // namespace megadlm::data
