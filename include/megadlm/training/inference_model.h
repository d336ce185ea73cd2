// A trained model opened for inference (generation, likelihood evaluation): a megadlm
// checkpoint saved under any parallel layout, or a Hugging Face Qwen2/Qwen3 folder read through
// the importer's mapping (checkpoint/huggingface.h), loaded whole (TP 1) on one device, fp32 on
// the CPU and bf16 on CUDA, with the architecture from the checkpoint's stored configuration.
// It implements LogitsModel, Fast-dLLM's key/value cache included (model/kv_cache.h).
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/diffusion/sampler.h"
#include "megadlm/model/exact_cache_graphs.h"
#include "megadlm/model/gpt_model.h"
#include "megadlm/model/kv_cache.h"
#include "megadlm/parallel/parameter_store.h"
#include "megadlm/training/training_config.h"

namespace megadlm::training {

struct InferenceSource {
  std::string load;                   ///< megadlm checkpoint directory (--load), or ""
  std::optional<int64_t> ckpt_step;   ///< --ckpt-step: this iteration instead of the latest
  std::string hf_dir;                 ///< Hugging Face folder (--hf-dir), or ""
};

class InferenceModel final : public LogitsModel {
 public:
  /// Opens `source` (exactly one of load / hf_dir), verifies the checkpoint's files (sizes and
  /// SHA-256) and loads the weights onto `device`. Throws naming the directory and the problem.
  InferenceModel(const InferenceSource& source, Device device);
  ~InferenceModel() override;

  /// The stored configuration (model architecture, mask token, sequence length, ...).
  const RunConfig& config() const { return cfg_; }
  /// Where the weights came from, for logs ("checkpoint /ckpt/iter_0000100 (saved under ...)").
  const std::string& description() const { return description_; }

  /// The real vocabulary (--vocab-size), not the padded one: a padded row of the output layer
  /// is never proposed or normalised over (docs/generation.md, "The vocabulary").
  int64_t vocab_size() const override;
  /// The padded vocabulary: every row of the embedding (a mask token may sit among the padding).
  int64_t input_vocab_size() const override { return cfg_.model.padded_vocab_size; }
  int64_t max_positions() const override { return cfg_.model.max_position_embeddings; }
  const Stream& stream() const override { return rt_.stream; }
  Tensor logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows) override;
  bool supports_kv_cache() const override { return true; }
  Tensor cached_logits(const CanvasBatch& canvas, const std::vector<int32_t>& rows, int64_t col0, int64_t col1,
                       bool refresh) override;
  bool supports_exact_cache() const override { return true; }
  void exact_cache_reset(int64_t batch, int64_t seq) override;
  Tensor exact_cache_logits(const CanvasBatch& window, int64_t col0, const std::vector<int32_t>& key_documents,
                            bool causal, const std::vector<int32_t>& rows) override;
  std::string exact_cache_graphs_unsupported() const override;
  void set_exact_cache_graphs(bool on) override;
  /// What the CUDA graphs of the cached steps did (eager runs, captures, replays), for logs.
  const GraphSchedule& exact_cache_graph_schedule() const { return graphs_.schedule(); }

 private:
  RunConfig cfg_;
  std::string description_;
  ModelRuntime rt_;
  ParameterStore store_;
  std::unique_ptr<GptModel> model_;
  KvCache cache_;  // the last refresh's keys and values (--kv-cache), or block decoding's exact cache
  ExactCacheGraphs graphs_;  // --cuda-graphs: the exact cache's steps as CUDA graphs
  bool use_graphs_ = false;
};

}  // namespace megadlm::training
