// --save-gradients DIR (a megadlm diagnostic): one iteration's full fp32 gradients, written in a
// form that does not depend on the layout that computed them, so that two layouts (or two
// micro-batch sizes) of the same step can be compared tensor by tensor
// (scripts/compare_gradients.py; docs/parallelism/equivalence.md).
//
// What is written: after the iteration's backward and every gradient reduction (the gradients
// the optimizer would read, of the loss normalised by the global batch's loss tokens), before
// clipping (the clip coefficient multiplies the gradients inside the optimizer step, not in the
// buffer) and before the step. Each rank describes its reduced gradients exactly as a checkpoint
// save describes its fp32 master weights (training/checkpoint/training_state.h: the owned ranges
// of its data-parallel wrapper, the tensor-parallel box of each parameter, one writer per element
// across data-parallel replicas, tensor-parallel replicas and tied pipeline copies), and the
// checkpoint writer stores them with its own checks (the pieces of every tensor must cover it
// exactly once). Rank 0 then reads every tensor whole through the checkpoint reader, which
// assembles any layout, and writes one safetensors file:
//
//   DIR/gradients.safetensors   key = the parameter's global name (the checkpoint's names
//                               without "model/": "decoder.layers.0.mlp.linear_fc1.weight"),
//                               F32, the global shape; __metadata__: format
//                               "megadlm-gradients", iteration, layout (world, tp, pp, cp, dp, ep, wrapper)
//
// The sharded intermediate (DIR/sharded) is removed afterwards. Rank 0 holds the whole model's
// gradients in host memory while it writes: meant for test-sized models.
#pragma once
#include <cstdint>
#include <string>
#include "megadlm/training/parallelize.h"
#include "megadlm/training/training_config.h"

namespace megadlm {

/// The assembled file's name inside the --save-gradients directory.
inline constexpr const char* kGradientsFileName = "gradients.safetensors";

/// Collective over `pm.world`: writes this iteration's reduced gradients (valid after the data-
/// parallel wrapper's finish_grad_sync, before the optimizer step) to `dir`/gradients.safetensors.
/// Returns the file's path (on every rank).
std::string save_gradients(const ParallelModel& pm, const RunConfig& config, const std::string& dir,
                           int64_t iteration);

}  // namespace megadlm
