// Byte accounting of what a model keeps for backward: the tensors of a ModelRecord (one per
// in-flight micro-batch), each storage counted once, activations priced in the dtype the run
// stores them in and statistics (log-sum-exps, norm statistics, per-token losses) in f32. Every
// saved tensor is [tokens on this rank, width] or [batch, heads, sequence on this rank], so the
// count is linear in the tokens a rank holds: context parallelism divides it by the CP size
// (tests/layout/context_parallel/test_cp_memory.cpp), and apps/activation_memory scales a small
// CPU measurement to long sequences.
#pragma once
#include <cstdint>
#include "megadlm/core/dtype.h"
#include "megadlm/model/gpt_model.h"

namespace megadlm {

struct SavedActivationBytes {
  int64_t layers = 0;  ///< every transformer layer's record
  int64_t head = 0;    ///< final norm, output-layer input, the cross-entropy gradient, losses
  int64_t total() const { return layers + head; }
};

/// The bytes `rec` holds, with activation tensors priced in `activation_dtype` (bf16 for a CUDA
/// run, whatever the CPU computed in) and statistics in f32.
SavedActivationBytes saved_activation_bytes(const ModelRecord& rec, DType activation_dtype);

}  // namespace megadlm
