#include "megadlm/training/data_setup.h"
#include <ostream>
#include "megadlm/core/error.h"
#include "megadlm/data/gpt_dataset.h"
#include "megadlm/data/mock_dataset.h"
#include "megadlm/data/sft_dataset.h"

namespace megadlm::training {

TrainingData build_training_data(const RunConfig& cfg, int rank, std::ostream& log) {
  TrainingData out;
  const DataConfig& dc = cfg.data;
  const TrainingConfig& tc = cfg.training;
  if (!dc.tokenizer_type.empty()) {
    data::TokenizerConfig t;
    t.type = dc.tokenizer_type;
    t.model = dc.tokenizer_model;
    t.vocab_file = dc.vocab_file;
    t.merge_file = dc.merge_file;
    t.vocab_size = cfg.model.vocab_size;
    out.tokenizer = data::load_tokenizer(t);
    log << " > tokenizer: " << out.tokenizer->describe() << "\n";
  }
  if (!dc.sft_data_path.empty()) {
    data::SftOptions o;
    o.seq_length = cfg.model.seq_length;
    o.chat_template = dc.sft_chat_template;
    o.seed = tc.seed;
    o.eos = out.tokenizer ? out.tokenizer->eod() : -1;
    auto sft = std::make_shared<data::SftDataset>(dc.sft_data_path, out.tokenizer.get(), o);
    log << " > supervised fine-tuning data: " << sft->num_examples() << " examples (" << sft->dropped()
        << " dropped: prompt longer than --seq-length; " << sft->truncated() << " responses cut), template "
        << dc.sft_chat_template << "\n";
    out.train = sft;
    return out;
  }
  if (dc.mock_data) {
    // Megatron's mock data has its own validation and test sets; ours differ by seed.
    const uint64_t seed = tc.seed;
    out.train = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length,
                                                 cfg.diffusion.mask_token, seed);
    if (tc.eval_iters > 0) {
      out.valid = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length,
                                                   cfg.diffusion.mask_token, seed + 1);
      out.test = std::make_shared<MockGptDataset>(cfg.model.vocab_size, cfg.model.seq_length,
                                                  cfg.diffusion.mask_token, seed + 2);
    }
    return out;
  }

  data::DataSources src;
  if (!dc.data_path.empty()) {
    src.blend = data::parse_blend(dc.data_path, "--data-path");
    src.split = dc.split;
  } else {
    const std::vector<std::string>* per[3] = {&dc.train_data_path, &dc.valid_data_path, &dc.test_data_path};
    const char* flag[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    for (size_t s = 0; s < 3; ++s)
      if (!per[s]->empty()) src.per_split[s] = data::parse_blend(*per[s], flag[s]);
    MDLM_CHECK(src.per_split[0].has_value(), "no training data: give --data-path or --train-data-path");
  }
  // Megatron's sample counts: the validation set is sized for every evaluation of the run, so
  // its indices (and the cache) are the ones Megatron builds; megadlm evaluates the first
  // --eval-iters batches each time (fixed held-out samples, fixed noise).
  const int64_t gbs = tc.global_batch_size;
  std::array<std::optional<int64_t>, 3> want;
  want[0] = tc.train_iters * gbs;
  if (tc.eval_iters > 0) {
    const int64_t evals = tc.eval_interval > 0 ? tc.train_iters / tc.eval_interval + 1 : 1;
    want[1] = evals * tc.eval_iters * gbs;
    want[2] = static_cast<int64_t>(tc.eval_iters) * gbs;
  }
  data::GptDatasetOptions o;
  o.seq_length = cfg.model.seq_length;
  o.seed = static_cast<uint32_t>(tc.seed);
  o.vocab_size = cfg.model.vocab_size;
  o.eod_token = out.tokenizer ? out.tokenizer->eod() : -1;
  o.cache_dir = dc.data_cache_path;
  o.write_cache = rank == 0;
  o.renormalize_blend_weights = dc.renormalize_blend_weights;
  o.log = &log;
  log << "> building train, validation, and test datasets for GPT ...\n";
  const data::SplitDatasets splits = data::build_gpt_datasets(src, want, o);
  out.train = splits.train();
  out.valid = splits.valid();
  out.test = splits.test();
  MDLM_CHECK(out.train != nullptr, "the training split is empty: check --split \"", dc.split, "\"");
  if (out.train->num_samples() >= 0 && out.train->num_samples() < *want[0])
    MDLM_FAIL("the training data provides ", out.train->num_samples(), " samples but --train-iters ",
              tc.train_iters, " x --global-batch-size ", gbs, " needs ", *want[0],
              " (an unweighted blend draws one epoch of each dataset; give weights to repeat them)");
  if (tc.eval_iters > 0 && !out.valid) log << " > no validation split: evaluation is skipped\n";
  log << "> finished creating GPT datasets ...\n";
  if (out.tokenizer) {
    const std::vector<int32_t> first = out.train->sample(0);
    std::string text = out.tokenizer->decode(first);
    if (text.size() > 300) text = text.substr(0, 300) + "...";
    log << " > first training sample, decoded: " << text << "\n";
  }
  return out;
}

}  // namespace megadlm::training
