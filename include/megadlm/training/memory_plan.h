// The memory planner: what one GPU (or the host, for the CPU backend) of a configured layout
// holds at its peak, from the model shapes and the layout alone — no GPU, no allocation — so a
// user learns before launching whether a layout fits (`--dry-run`), a launch that would not fit
// stops before allocating, and training logs the prediction next to the measured peak.
//
// What it counts, per pipeline stage (every TP/CP/DP rank of a stage holds the same):
//   * model state: this rank's parameters registered exactly as the model registers them (the
//     real GptModel chunks of the stage, TP-local), laid out in the flat buffers exactly as the
//     data-parallel wrapper lays them out (ParameterStore::lay_out), times the bytes of what the
//     wrapper keeps (DDP, distributed optimizer, the four FSDP strategies);
//   * activations: the per-micro-batch records the layers save (model/attention.h, mlp.h,
//     transformer_layer.h Saved / LayerRecord; a recomputed unit keeps only its input), times
//     the records live at the worst point of this stage's pipeline schedule (the real
//     pp::build_schedule action list, replayed);
//   * logits and loss of the head's in-flight micro-batches (the logits buffer that the fused
//     cross-entropy turns into its gradient, the final norm's input and output, the losses);
//   * communication buffers (FSDP gather windows and gradient slots, pipeline receive buffers);
//   * workspaces: one layer's backward temporaries, a recomputed unit's rebuilt records, the
//     flash-attention backward's fp32 accumulators, cuBLASLt's 32 MiB per stream.
// The sum is the predicted high-water mark of the stream-ordered pool (what the trainer reports
// as peak memory); the CUDA context, cuBLASLt handles and NCCL's own buffers live outside the
// pool and are counted as a fixed reserve when deciding whether a layout fits.
// Not modelled yet: MoE routing buffers (a MoE layer's activations are counted as a dense MLP's;
// its experts' parameters and optimizer state exactly), context parallelism's attention buffers
// (CP divides the tokens per rank; its ring buffers are not counted), tensor-parallel
// communication overlap buffers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "megadlm/training/training_config.h"

namespace megadlm {

enum class PlanDevice { Cuda, Cpu };

/// One pipeline stage's rank at its peak, in bytes.
struct StageMemory {
  int pp_rank = 0;
  int64_t parameters = 0;        ///< this rank's (TP-local) parameter elements, without padding
  int64_t weights = 0;           ///< model weights (bf16 on CUDA): full, or this rank's FSDP shard
  int64_t grads = 0;             ///< fp32 main gradients (+ the distributed optimizer's reduced shard)
  int64_t masters = 0;           ///< fp32 master weights (0 where they are the fp32 weights)
  int64_t moments = 0;           ///< Adam m and v
  /// FP8: the codes of the FP8 linears' and local experts' weights kept through a step (each
  /// one's cast at its first use, or the --fp8-param-gather codes in its place): CUDA 2 bytes an
  /// element (both orientations), the CPU decoded f32 (4; 8 blockwise). The gather's staging
  /// buffer is in comm_buffers.
  int64_t fp8_codes = 0;
  int64_t activations_per_micro_batch = 0;  ///< saved records of one micro-batch, all chunks
  int64_t activations = 0;       ///< saved records at the schedule's worst point
  double micro_batches_in_flight = 0;       ///< activations / activations_per_micro_batch
  int64_t logits_and_loss = 0;   ///< head micro-batches in flight at that point
  int64_t comm_buffers = 0;      ///< FSDP windows and slots, pipeline receive buffers
  int64_t workspaces = 0;        ///< temporaries of one layer's backward, recomputation, cuBLASLt

  int64_t persistent() const { return weights + grads + masters + moments + fp8_codes; }
  /// Predicted high-water mark of the memory pool.
  int64_t peak() const { return persistent() + activations + logits_and_loss + comm_buffers + workspaces; }
};

struct MemoryPlan {
  PlanDevice device = PlanDevice::Cuda;
  int64_t capacity = 0;         ///< bytes: --gpu-memory-gb (CUDA) or the host's memory (CPU)
  int64_t runtime_reserve = 0;  ///< outside the pool: CUDA context, cuBLASLt handles, NCCL buffers
  std::vector<StageMemory> stages;  ///< one per pipeline stage, in pp-rank order
  int busiest = 0;              ///< index of the stage with the largest peak
  std::vector<std::string> notes;   ///< what this prediction leaves out for this configuration

  const StageMemory& peak_stage() const { return stages[static_cast<size_t>(busiest)]; }
  int64_t needed() const { return peak_stage().peak() + runtime_reserve; }
  bool fits() const { return needed() <= capacity; }
};

/// The plan of `config` on `device` (CUDA: bf16 weights and activations; CPU: fp32). CPU:
/// `host_ranks` processes share the host's memory. Throws megadlm::Error when the configuration
/// cannot be laid out (it has not been validated).
MemoryPlan plan_memory(const RunConfig& config, PlanDevice device, int host_ranks = 1);

/// The device a plan should describe: the configured one, except that a dry run without an
/// explicit --device plans the GPU launch it prepares.
PlanDevice plan_device(const RunConfig& config, bool dry_run, bool device_given);

/// What the planner counts for one micro-batch's records on a rank of `config`: one
/// transformer layer's (no recomputation) and the head's. Tests compare them with the bytes a
/// real forward keeps (model/saved_activations.h).
struct PlannedRecordBytes {
  int64_t per_layer = 0;
  int64_t head = 0;
};
PlannedRecordBytes planned_record_bytes(const RunConfig& config, PlanDevice device);

/// The table `--dry-run` prints (one column per stage when pipelined) and the fits verdict.
std::string format_memory_plan(const MemoryPlan& plan, const RunConfig& config);

/// When the plan does not fit: "does not fit: ..." with the predicted bytes and the changes
/// that would make it fit (each re-planned), or how many GPUs the model state alone needs.
/// Empty when it fits.
std::string memory_advice(const RunConfig& config, const MemoryPlan& plan);

}  // namespace megadlm
