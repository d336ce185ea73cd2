// Runs one rank's pipeline schedule (schedule.h): the forward and backward of each
// (micro-batch, chunk) through callbacks, and the batched point-to-point transfers between
// neighbouring stages. Like Megatron's schedules take a forward-step function, the executor knows
// nothing about models, losses or data: it owns the activations and gradients in flight between
// the actions and the transfers, and checks that the schedule leaves nothing behind.
#pragma once
#include <functional>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/parallel/pipeline_parallel/schedule.h"

namespace megadlm::pp {

/// What the executor calls. `micro_batch` in [0, M), `chunk` in [0, V) (this rank's chunks).
struct StageFunctions {
  /// Forward of the chunk. `input`: the previous virtual stage's output (undefined for the first
  /// virtual stage, which reads data). Returns the output for the next virtual stage (ignored,
  /// may be undefined, for the last virtual stage, which computes the loss).
  std::function<Tensor(int micro_batch, int chunk, const Tensor& input)> forward;
  /// Backward of the chunk. `output_grad`: the next virtual stage's input gradient (undefined for
  /// the last virtual stage: its gradient starts at the loss). Returns the gradient of the
  /// chunk's input (ignored for the first virtual stage).
  std::function<Tensor(int micro_batch, int chunk, const Tensor& output_grad)> backward;
  /// A buffer to receive the activation (or its gradient: same shape) of (micro_batch, chunk).
  std::function<Tensor(int micro_batch, int chunk)> receive_buffer;
};

/// Runs `actions` (built by build_schedule(config)) on this rank. `pp`: the pipeline group (may
/// be null when config.pp_size == 1). Transfers are issued on `stream`.
void run_schedule(const std::vector<Action>& actions, const ScheduleConfig& config,
                  const StageFunctions& stage, comm::Communicator* pp, const Stream& stream);

}  // namespace megadlm::pp
