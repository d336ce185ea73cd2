// --use-checkpoint-args: the model flags a checkpoint was trained with, as command-line tokens
// (applied before validation, as Megatron does). They are put in front of the user's flags, so
// a flag given on
// the command line wins, as in Megatron's load_args_from_checkpoint. This file knows flag
// spellings, so it lives next to training/arguments (the typed configs never do).
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/training/training_config.h"

namespace megadlm::training {

/// Flags that rebuild `config`'s architecture, vocabulary and mask token: --num-layers,
/// --hidden-size, ..., --vocab-size with the --make-vocab-size-divisible-by that reproduces the
/// padded vocabulary at tensor-parallel size 1 (vocab_padding_multiple).
std::vector<std::string> checkpoint_model_args(const RunConfig& config);

/// The powers of two m such that padding `vocab_size` to a multiple of m gives
/// `padded_vocab_size`: the values --make-vocab-size-divisible-by x TP may take to rebuild it.
std::vector<int64_t> vocab_padding_multiples(int64_t vocab_size, int64_t padded_vocab_size);
/// The one of them written for --use-checkpoint-args (TP 1): 128 (Megatron's default) when it
/// fits, else the largest below 128, else the smallest above; 1 when none fits.
int64_t vocab_padding_multiple(int64_t vocab_size, int64_t padded_vocab_size);

/// When `tokens` (the @file-expanded command line) hold --use-checkpoint-args and --load DIR,
/// returns them with the checkpoint's model flags in front; otherwise unchanged. Problems (no
/// checkpoint in DIR, a damaged index) are appended to `errors`.
std::vector<std::string> with_checkpoint_args(const std::vector<std::string>& tokens,
                                              std::vector<std::string>& errors);

}  // namespace megadlm::training
