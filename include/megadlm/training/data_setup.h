// From the data flags to the datasets a run trains and evaluates on: mock data, or Megatron
// indexed datasets (--data-path with --split, or the per-split paths) built as Megatron builds
// them, sized for --train-iters and the evaluation schedule; and the tokenizer, when named.
#pragma once
#include <iosfwd>
#include <memory>
#include "megadlm/data/sample_source.h"
#include "megadlm/data/tokenizer.h"
#include "megadlm/training/training_config.h"

namespace megadlm::training {

struct TrainingData {
  std::shared_ptr<const SampleSource> train, valid, test;  ///< valid / test may be null
  std::shared_ptr<const data::Tokenizer> tokenizer;        ///< null without --tokenizer-type
};

/// Opens and validates the data (errors name the file and the problem) and builds the sample
/// indices, reading and writing the --data-cache-path cache (`rank` 0 writes it). Logs what it
/// found and, with a tokenizer, the start of the first training sample decoded.
TrainingData build_training_data(const RunConfig& config, int rank, std::ostream& log);

}  // namespace megadlm::training
