// Typed, validated configuration of a training run by concern. Library APIs
// take these, never the raw flag values; training/arguments builds them from Megatron flags.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/core/logging.h"
#include "megadlm/diffusion/diffusion_config.h"
#include "megadlm/model/transformer_config.h"
#include "megadlm/parallel/parallel_config.h"

namespace megadlm {

enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Exponential, Linear, Cosine };

struct OptimizerConfig {
  float lr = 0.0f;              ///< --lr (max LR)
  float min_lr = 0.0f;
  float lr_warmup_init = 0.0f;
  LrDecayStyle decay_style = LrDecayStyle::Linear;
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::Exponential;
  int64_t lr_warmup_iters = 0;  ///< resolved (from --lr-warmup-iters or --lr-warmup-fraction)
  int64_t lr_decay_iters = 0;   ///< resolved: defaults to train_iters
  int64_t lr_wsd_decay_iters = 0;
  float weight_decay = 0.01f;
  float adam_beta1 = 0.9f;
  float adam_beta2 = 0.999f;
  float adam_eps = 1e-8f;
  float clip_grad = 1.0f;       ///< 0 disables clipping
};

enum class DeviceKind { Cpu, Cuda };

struct TrainingConfig {
  int micro_batch_size = 1;
  int global_batch_size = 1;     ///< resolved: mbs * dp when unset
  int64_t train_iters = 0;
  uint64_t seed = 1234;
  bool bf16 = false;
  DeviceKind device = DeviceKind::Cpu;  ///< resolved: cuda when a GPU is visible, unless --device
  int log_interval = 100;
  std::string metrics_jsonl;     ///< --metrics-jsonl PATH ("" = off)
  std::string tensorboard_dir;   ///< --tensorboard-dir ("" = off; training/tensorboard_writer.h)
  int tensorboard_log_interval = 1;
  bool log_timers_to_tensorboard = false;
  bool log_throughput = false;
  bool log_memory_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  int eval_interval = 1000;
  int eval_iters = 100;
  std::optional<int64_t> exit_interval;
  std::optional<int64_t> exit_duration_in_mins;  ///< save (with --save) and stop after this long
  bool exit_signal_handler = false;  ///< stop cleanly on SIGTERM/SIGUSR1 even without --save
  bool check_for_nan_in_loss_and_grad = true;
  /// --gpu-memory-gb: what the memory planner (training/memory_plan.h) may use per GPU.
  double gpu_memory_gb = 141.0;
  /// Where a communication timeout or abort writes each rank's last collectives ("" = the
  /// system's temporary directory); resolved from --collective-log-dir, --metrics-jsonl, --save.
  std::string collective_log_dir;
  /// --save-gradients DIR ("" = off): iteration save_gradients_iteration's reduced gradients,
  /// before clipping, as DIR/gradients.safetensors (training/gradient_dump.h).
  std::string save_gradients;
  int64_t save_gradients_iteration = 1;
  /// --profile: steps (profile_step_start, profile_step_end] (counted in completed iterations,
  /// as Megatron does) run between cudaProfilerStart and cudaProfilerStop on profile_ranks.
  bool profile = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<int64_t> profile_ranks = {0};

  int num_micro_batches(int data_parallel_size) const {
    return global_batch_size / (micro_batch_size * data_parallel_size);
  }
};

struct DataConfig {
  bool mock_data = false;
  std::vector<std::string> data_path;  ///< Megatron blend: prefix, or weight prefix pairs
  std::string split = "969, 30, 1";
  /// --train-data-path, --valid-data-path, --test-data-path (per-split blends).
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::string data_cache_path;
  bool renormalize_blend_weights = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool cut_off_varlen_to_seqlen = false;
  /// Resolved: tokens attend only within their document (packed difflm batches, or
  /// --reset-attention-mask in vanilla mode).
  bool per_document_attention = false;
  std::string tokenizer_type;
  std::string tokenizer_model;
  std::string vocab_file;
  std::string merge_file;
  /// --sft-data-path: supervised fine-tuning JSONL (data/sft_dataset.h); with --sft-chat-template.
  std::vector<std::string> sft_data_path;
  std::string sft_chat_template = "plain";
};

/// Checkpoint saving and loading (--save, --load, ...; docs/checkpoints.md).
struct CheckpointConfig {
  std::string save;                    ///< --save DIR ("" = never save)
  int64_t save_interval = 0;           ///< --save-interval (0: only at exit and at the end)
  std::vector<int64_t> extra_save_iterations;  ///< --checkpoint-steps (saved after step k + 1)
  std::string load;                    ///< --load DIR ("" = start from scratch)
  std::optional<int64_t> ckpt_step;    ///< --ckpt-step: load this iteration, not the latest
  bool save_optim = true;              ///< false with --no-save-optim
  bool save_rng = true;                ///< false with --no-save-rng
  bool load_optim = true;              ///< false with --no-load-optim
  bool load_rng = true;                ///< false with --no-load-rng
  bool finetune = false;               ///< weights only; iteration, data and optimizer restart
  bool async_save = false;             ///< --async-save: write on a background thread
  bool exit_on_missing_checkpoint = false;
  bool override_opt_param_scheduler = false;       ///< LR settings from the flags
  bool use_checkpoint_opt_param_scheduler = false; ///< LR settings from the checkpoint
  /// Rolling ("non-persistent") checkpoints, Megatron's global type: every N iterations a full
  /// checkpoint into the rolling directory, older ones there removed (0: none).
  int64_t non_persistent_save_interval = 0;
  /// --non-persistent-ckpt-type global: also consider the rolling checkpoint when loading.
  bool non_persistent_global = false;
  /// --non-persistent-global-ckpt-dir ("" = DIR/non_persistent below --save / --load).
  std::string non_persistent_global_ckpt_dir;
  /// --keep-last-n-checkpoints: after each persistent save has committed, only the newest N
  /// complete checkpoints of this run's trajectory in --save stay (and always the one "latest"
  /// names and the one this run was loaded from; other trajectories' are never removed); 0 keeps all.
  int64_t keep_last_n_checkpoints = 0;
  /// --overwrite-checkpoints: this run may save over complete checkpoints of another trajectory
  /// in --save (a fresh run into a used folder, or a rewind below newer checkpoints).
  bool overwrite_checkpoints = false;

  /// Megatron's _NON_PERSISTENT_CKPT_SUBDIR.
  static constexpr const char* kNonPersistentSubdir = "non_persistent";
  /// Where rolling saves go: the explicit directory, else <save>/non_persistent.
  std::string non_persistent_save_dir() const { return rolling_dir(save); }
  /// Where a load looks for a rolling checkpoint: the explicit directory, else <load>/non_persistent.
  std::string non_persistent_load_dir() const { return rolling_dir(load); }

 private:
  std::string rolling_dir(const std::string& base) const {
    if (!non_persistent_global_ckpt_dir.empty()) return non_persistent_global_ckpt_dir;
    if (base.empty()) return "";
    return base + (base.back() == '/' ? "" : "/") + kNonPersistentSubdir;
  }
};

/// Where diagnostic messages go (core/logging.h; the program passes it with the rank to
/// logging::configure). Megatron's record (arguments, iteration lines) is not affected.
struct LoggingConfig {
  logging::Level level = logging::Level::Info;  ///< --log-level, or --logging-level mapped onto it
  bool all_ranks = false;               ///< --log-all-ranks
  std::string dir;                      ///< --log-dir ("" = no per-rank files)
};

/// --rerun-mode (Megatron's RerunMode): what happens to a rejected step (training/fault_detection.h).
enum class RerunMode {
  Disabled,         ///< no replay: a NaN stops the run (with the check on), spikes are reported
  ValidateResults,  ///< a rejected step is replayed to tell a transient fault from a real result
  ReportStats,      ///< every step is replayed once; how often the replay differs is reported
};
/// --error-injection-type: the fault --error-injection-rate simulates (for testing the replay).
enum class ErrorInjectionType {
  CorrectResult,    ///< a correct result flagged as suspicious: the replay confirms it
  TransientError,   ///< the first computation is corrupted (NaN loss), the replay is clean
  PersistentError,  ///< every computation of the step is corrupted the same way
};

struct FaultDetectionConfig {
  RerunMode rerun_mode = RerunMode::Disabled;
  bool check_spiky_loss = false;   ///< --check-for-spiky-loss: loss >= spike_factor x reference
  bool check_large_grads = false;  ///< --check-for-large-grads: the same for the gradient norm
  double spike_factor = 10.0;      ///< Megatron's factor for both
  int64_t error_injection_rate = 0;  ///< inject in about one of N checked steps (0: never)
  ErrorInjectionType error_injection_type = ErrorInjectionType::TransientError;
};

/// --fp8-format: which FP8 types the linear GEMMs use (docs/fp8.md).
enum class Fp8Format {
  E4M3,    ///< e4m3 for every tensor
  Hybrid,  ///< e4m3 activations and weights, e5m2 gradients
};
/// --fp8-recipe: how FP8 scales are chosen (mxfp8 and custom are refused, FP8-1 / FP8-2).
enum class Fp8Recipe {
  Delayed,     ///< per tensor, from an amax history of earlier steps
  Tensorwise,  ///< per tensor, from the tensor's own amax ("current scaling")
  Blockwise,   ///< one scale per 1x128 tile (activations, gradients) or 128x128 block (weights)
  Mxfp8,       ///< 1x32 blocks with power-of-2 scales (Blackwell only; refused)
  Custom,      ///< a Python quantizer factory (refused)
};
/// --fp8-amax-compute-algo: the amax a delayed scale is computed from.
enum class Fp8AmaxComputeAlgo { MostRecent, Max };

/// The FP8 flags, typed. `format` empty = FP8 off. Validated by the FP8-* rules (docs/rules.md);
/// training in FP8 is not wired yet, so today a RunConfig with a format only comes out of a
/// dry run that reports it as not supported.
struct Fp8Config {
  std::optional<Fp8Format> format;                              ///< --fp8-format
  Fp8Recipe recipe = Fp8Recipe::Delayed;                        ///< --fp8-recipe
  int margin = 0;                                               ///< --fp8-margin (delayed)
  int amax_history_len = 1;                                     ///< --fp8-amax-history-len (delayed)
  Fp8AmaxComputeAlgo amax_compute_algo = Fp8AmaxComputeAlgo::MostRecent;  ///< delayed
  bool wgrad = true;                                            ///< false: --no-fp8-wgrad
  bool param_gather = false;                                    ///< --fp8-param-gather
  bool first_last_layers_bf16 = false;                          ///< --first-last-layers-bf16
  int num_layers_at_start_in_bf16 = 1;                          ///< with first_last_layers_bf16
  int num_layers_at_end_in_bf16 = 1;                            ///< with first_last_layers_bf16
  bool enabled() const { return format.has_value(); }
};

/// Everything pretrain_difflm needs, after validation.
struct RunConfig {
  ParallelConfig parallel;
  TransformerConfig model;
  DiffusionConfig diffusion;
  OptimizerConfig optimizer;
  TrainingConfig training;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  FaultDetectionConfig fault_detection;
  Fp8Config fp8;
};

}  // namespace megadlm
