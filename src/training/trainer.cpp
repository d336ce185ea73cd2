#include "megadlm/training/trainer.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <ostream>
#include <sstream>
#include "megadlm/core/logging.h"
#include "megadlm/core/profiler.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/pipeline_parallel/executor.h"
#include "megadlm/parallel/pipeline_parallel/schedule.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/diffusion/sft_process.h"
#include "megadlm/training/flops.h"
#include "megadlm/training/gradient_dump.h"
#include "megadlm/training/lr_schedule.h"
#include "megadlm/training/memory_plan.h"

namespace megadlm {

Trainer::Trainer(const RunConfig& config, std::shared_ptr<const SampleSource> data,
                 std::ostream& log, const parallel::ProcessGroups* groups)
    : cfg_(config),
      data_(std::move(data)),
      log_(log),
      pm_(parallelize(cfg_, groups)),
      training_log_(cfg_, log_, pm_->rank == 0) {
  MDLM_CHECK(data_ != nullptr, "Trainer needs a sample source");
  flops_per_iteration_ = megatron_flops_per_iteration(cfg_.model, cfg_.training.global_batch_size,
                                                     cfg_.diffusion.block_size);
  // The planner's peak for this rank's stage, logged next to the measured one.
  try {
    const PlanDevice device = cfg_.training.device == DeviceKind::Cuda ? PlanDevice::Cuda : PlanDevice::Cpu;
    const MemoryPlan plan = plan_memory(cfg_, device);
    predicted_peak_gb_ = static_cast<double>(plan.stages.at(static_cast<size_t>(pm_->pp_rank)).peak()) / 1e9;
  } catch (const std::exception&) {
    predicted_peak_gb_ = -1;  // a layout the planner cannot describe: no prediction to show
  }
  training_log_.startup(startup_summary());
  training_log_.check_metrics_file();
  load_checkpoint();
}

std::string Trainer::startup_summary() const {
  const ParallelModel& pm = *pm_;
  const ModelParallel& mp = pm.model_parallel;
  const int vpp = pm.virtual_stages();
  std::ostringstream os;
  os << " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
     << pm.store.num_parameters() << "\n"
     << " > device: " << pm.runtime.stream.device().str() << ", model dtype "
     << dtype_name(pm.runtime.dtype) << ", fp32 master weights and gradients; pipeline-parallel size "
     << pm.pp_size << (vpp > 1 ? " x " + std::to_string(vpp) + " virtual stages" : std::string())
     << ", tensor-parallel size " << mp.tp.size
     << (mp.sequence_parallel ? " (sequence parallel)" : "")
     << (mp.cp.size > 1 ? ", context-parallel size " + std::to_string(mp.cp.size) : std::string())
     << ", data-parallel size " << pm.data_shard.size << pm.data_parallel->summary() << ", "
     << pm.store.buckets().size() << " gradient bucket(s)\n";
  return os.str();
}

double Trainer::sum_over(const std::shared_ptr<comm::Communicator>& group, double local) {
  if (!group || group->size() == 1) return local;
  const Stream& s = pm_->runtime.stream;
  Tensor t = Tensor::from_floats({0.0f}, {1}, DType::F64);
  t.data<double>()[0] = local;
  if (!s.device().is_cpu()) t = t.to(s.device(), s);
  group->all_reduce(t, comm::ReduceOp::Sum, s);
  group->synchronize(s);
  Tensor host = t.to(Device::cpu(), s);
  return host.data<double>()[0];
}

void Trainer::sum_loss_over_pipeline(Tensor& loss_sum) {
  if (!pm_->pipeline || pm_->pp_size == 1) return;
  const Stream& s = pm_->runtime.stream;
  pm_->pipeline->all_reduce(loss_sum, comm::ReduceOp::Sum, s);
  pm_->pipeline->synchronize(s);
}

Trainer::~Trainer() = default;

BatchContext Trainer::batch_context(bool training) const {
  BatchContext ctx;
  ctx.seed = cfg_.training.seed;
  ctx.micro_batch_size = cfg_.training.micro_batch_size;
  ctx.training = training;
  ctx.bidirectional = cfg_.model.attention_mask == AttentionMaskType::NoMask;
  ctx.eod_token = data_->eod_token();
  ctx.eod_mask_loss = cfg_.data.eod_mask_loss;
  ctx.reset_position_ids = cfg_.data.reset_position_ids;
  ctx.per_document_attention = cfg_.data.per_document_attention;
  return ctx;
}

std::vector<HostMicroBatch> Trainer::host_micro_batches(const SampleSource& data, int64_t first,
                                                        const BatchContext& ctx,
                                                        double& local_tokens) const {
  const int64_t mbs = cfg_.training.micro_batch_size;
  const DataShard& shard = pm_->data_shard;  // the data group decides, not the gradient group
  const int64_t num_mb = cfg_.training.num_micro_batches(shard.size);
  std::vector<HostMicroBatch> host(static_cast<size_t>(num_mb));
  local_tokens = 0;
  // The block-size warm-up (--dlm-block-size-schedule): this iteration's block size.
  DiffusionConfig diffusion = cfg_.diffusion;
  if (diffusion.block_diffusion()) diffusion.block_size = diffusion.block_size_at(iteration_);
  for (int64_t m = 0; m < num_mb; ++m) {
    std::vector<std::vector<int32_t>> samples;
    samples.reserve(static_cast<size_t>(mbs));
    const int64_t mb_first = shard.first_sample(first, m, mbs);
    for (int64_t b = 0; b < mbs; ++b) samples.push_back(data.sample(mb_first + b));
    if (cfg_.diffusion.sft) {  // prompt/response data: masks on the response only
      std::vector<int64_t> prompts;
      for (int64_t b = 0; b < mbs; ++b) prompts.push_back(data.prompt_length(mb_first + b));
      host[static_cast<size_t>(m)] = build_sft_micro_batch(samples, prompts, mb_first, diffusion, ctx);
    } else {
      host[static_cast<size_t>(m)] = build_micro_batch(samples, mb_first, diffusion, ctx);
    }
    for (int32_t id : host[static_cast<size_t>(m)].labels)
      MDLM_CHECK(id >= 0 && id < cfg_.model.padded_vocab_size, "sample ", mb_first, "..",
                 mb_first + mbs - 1, " holds token id ", id, ", outside the vocabulary [0, ",
                 cfg_.model.padded_vocab_size, ")");
    local_tokens += host[static_cast<size_t>(m)].loss_tokens;
  }
  return host;
}

void Trainer::set_evaluation_data(std::shared_ptr<const SampleSource> valid,
                                  std::shared_ptr<const SampleSource> test) {
  valid_ = std::move(valid);
  test_ = std::move(test);
}

double Trainer::evaluate(const SampleSource& data) {
  ModelRuntime& rt = pm_->runtime;
  const Stream& s = rt.stream;
  pm_->data_parallel->finish_param_gather();  // the weights of the last update must be in place
  // FP8: the linears' weight casts still hold the weights before the last update; evaluate the
  // updated ones (with --fp8-param-gather the gathered codes already are).
  if (pm_->model_parallel.fp8) pm_->model_parallel.fp8->weights_changed();
  rt.training = false;                        // no dropout
  const BatchContext ctx = batch_context(false);
  double num = 0, den = 0;
  for (int64_t it = 0; it < cfg_.training.eval_iters; ++it) {
    double local_tokens = 0;
    std::vector<HostMicroBatch> host = host_micro_batches(
        data, it * static_cast<int64_t>(cfg_.training.global_batch_size), ctx, local_tokens);
    Tensor loss_sum = Tensor::zeros({1}, DType::F32, s);
    run_schedule(host, loss_sum, 0.0f);  // forward only
    sum_loss_over_pipeline(loss_sum);    // the loss lives on the last stage
    num += static_cast<double>(loss_sum.to_floats(s)[0]);
    den += local_tokens;
  }
  rt.training = true;
  num = grad_sum(num);
  den = data_sum(den);
  return den > 0 ? num / den : NAN;
}

void Trainer::evaluate_and_log(const SampleSource& data, const std::string& what, const char* key) {
  const double loss = evaluate(data);
  training_log_.validation(loss, what, key, iteration_, consumed_samples_);
}

void Trainer::run_schedule(const std::vector<HostMicroBatch>& host, Tensor& loss_sum,
                           float grad_scale) {
  ParallelModel& pm = *pm_;
  const ModelRuntime& rt = pm.runtime;
  const Stream& s = rt.stream;
  const int num_mb = static_cast<int>(host.size());
  const int vpp = pm.virtual_stages();
  pp::ScheduleConfig sc;
  sc.pp_rank = pm.pp_rank;
  sc.pp_size = pm.pp_size;
  sc.virtual_stages = vpp;
  sc.num_micro_batches = num_mb;
  sc.forward_only = grad_scale <= 0;
  sc.microbatch_group_size = cfg_.parallel.microbatch_group_size_per_vp_stage;
  // The model side of the schedule: each micro-batch uploaded once (at its first use on this
  // rank; under CP only this rank's shard of the sequences) and dropped after its last; one
  // record per in-flight (micro-batch, chunk).
  const ParallelGroup& cp = pm.model_parallel.cp;
  using Key = std::pair<int, int>;
  std::map<int, MicroBatch> uploaded;
  std::map<Key, ModelRecord> records;
  auto batch = [&](int m) -> const MicroBatch& {
    auto it = uploaded.find(m);
    if (it == uploaded.end())
      it = uploaded.emplace(m, MicroBatch::upload(host[static_cast<size_t>(m)], s, cp.rank, cp.size)).first;
    return it->second;
  };
  pp::StageFunctions stage;
  stage.forward = [&](int m, int c, const Tensor& input) {
    const GptModel& chunk = *pm.chunks[static_cast<size_t>(c)];
    const Key key{m, c};
    Tensor out = chunk.forward(batch(m), input, records[key], loss_sum, grad_scale, rt);
    if (sc.forward_only) {  // evaluation: nothing to keep for a backward
      records.erase(key);
      if (c == vpp - 1) uploaded.erase(m);
    }
    return out;
  };
  stage.backward = [&](int m, int c, const Tensor& output_grad) {
    const GptModel& chunk = *pm.chunks[static_cast<size_t>(c)];
    const Key key{m, c};
    pm.data_parallel->set_last_micro_batch(m == num_mb - 1);
    Tensor din = chunk.backward(batch(m), output_grad, records[key], rt);
    records.erase(key);
    if (c == 0) uploaded.erase(m);  // its last use on this rank
    return din;
  };
  stage.receive_buffer = [&](int m, int c) {
    return Tensor::empty({pm.chunks[static_cast<size_t>(c)]->hidden_rows(batch(m).tokens()),
                          cfg_.model.hidden_size}, rt.dtype, s);
  };
  pp::run_schedule(pp::build_schedule(sc), sc, stage, pm.pipeline.get(), s);
  MDLM_CHECK(records.empty(), "pipeline schedule left ", records.size(),
             " model record(s) behind on pipeline rank ", pm.pp_rank);
}

IterationMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  ParallelModel& pm = *pm_;
  const Stream& s = pm.runtime.stream;
  const TrainingConfig& tc = cfg_.training;
  const int64_t first = consumed_samples_;

  // 1. This rank's host micro-batches and the global normaliser (the loss tokens of the whole
  //    samples: summed over the data group).
  double local_tokens = 0;
  const DiffusionConfig& dc = cfg_.diffusion;
  if (!dc.block_size_schedule.empty() && logging_rank() &&
      (iteration_ == 0 || dc.block_size_at(iteration_) != dc.block_size_at(iteration_ - 1) ||
       !announced_block_size_))
    log_ << " block-size schedule: block size " << dc.block_size_at(iteration_) << " from iteration "
         << iteration_ + 1 << std::endl;
  announced_block_size_ = true;
  std::vector<HostMicroBatch> host = host_micro_batches(*data_, first, batch_context(true), local_tokens);
  const double loss_tokens = data_sum(local_tokens);
  MDLM_CHECK(loss_tokens > 0, "iteration ", iteration_ + 1,
             ": the global batch has no token to train on (every loss-mask entry is 0)");

  // 2. The pipeline schedule: forwards and backwards of every (micro-batch, chunk) of this
  //    rank, with the transfers to the neighbouring stages batched as the schedule says.
  // 3-4. Loss and gradient norm (global). Only the last stage has a loss: the sum over the
  //      pipeline brings it to every stage; each rank of the gradient group holds its share.
  //    The fault detector runs this once, or again to replay a rejected result (same batch,
  //    same masks: training/fault_detection.h); the gradients left are those of its verdict.
  const FaultVerdict verdict = fault_detector_.run_step(iteration_ + 1, cfg_.training.seed, [&] {
    pm.store.zero_grads(s);
    pm.data_parallel->start_step();
    if (pm.moe) pm.moe->begin_step(s);
    if (pm.model_parallel.fp8) pm.model_parallel.fp8->begin_step(s);  // a replay records afresh
    Tensor loss_sum = Tensor::zeros({1}, DType::F32, s);
    run_schedule(host, loss_sum, static_cast<float>(1.0 / loss_tokens));
    pm.data_parallel->finish_grad_sync();
    sum_loss_over_pipeline(loss_sum);
    StepResult r;
    r.lm_loss = grad_sum(static_cast<double>(loss_sum.to_floats(s)[0])) / loss_tokens;
    r.grad_norm = std::sqrt(pm.data_parallel->grad_sq_norm());
    return r;
  });
  if (!verdict.report.empty()) logging::warn(verdict.report);
  if (verdict.action == FaultAction::Stop) stop_on_fault(verdict.report);
  // The update below comes from a flagged result: from here on the state is not a good one to
  // fall back to (stop_on_fault names the last state before it).
  if (verdict.flagged && verdict.action == FaultAction::Apply && !first_flagged_iteration_ &&
      std::isfinite(verdict.result.lm_loss) && std::isfinite(verdict.result.grad_norm)) {
    first_flagged_iteration_ = iteration_ + 1;
    first_flagged_report_ = verdict.report;
  }
  if (!tc.save_gradients.empty() && iteration_ + 1 == tc.save_gradients_iteration) {
    // --save-gradients: the reduced gradients the step below reads (before clipping).
    const std::string path = save_gradients(pm, cfg_, tc.save_gradients, iteration_ + 1);
    if (logging_rank()) log_ << " saved the gradients of iteration " << iteration_ + 1 << " to " << path << std::endl;
  }
  IterationMetrics out;
  out.fault_report = verdict.report;
  out.lm_loss = verdict.result.lm_loss;
  out.grad_norm = verdict.result.grad_norm;
  if (pm.moe) out.moe = finish_moe_step();
  const bool finite = std::isfinite(out.grad_norm) && std::isfinite(out.lm_loss);
  if (verdict.action == FaultAction::Skip) {
    out.skipped = true;
    ++skipped_iterations_;
  } else if (!finite) {
    out.nan = true;
    out.skipped = true;
    ++nan_iterations_;
    ++skipped_iterations_;
    MDLM_CHECK(!tc.check_for_nan_in_loss_and_grad, "iteration ", iteration_ + 1,
               ": found a non-finite value (lm loss ", out.lm_loss, ", grad norm ", out.grad_norm,
               "); the update was not applied. Lower --lr or disable the check with "
               "--no-check-for-nan-in-loss-and-grad");
  } else {
    // 5. Clip, AdamW on this rank's masters, refresh (and gather) the model weights. The clip
    //    coefficient multiplies each gradient as the step reads it (bitwise what scaling the
    //    buffer first gave, without a pass over it); nothing reads the gradients after the
    //    step: the next one zeroes them.
    Tensor grads = pm.data_parallel->optimizer_grads();
    const double clip = cfg_.optimizer.clip_grad;
    float grad_scale = 1.0f;
    if (clip > 0) {
      const double coeff = clip / (out.grad_norm + 1e-6);
      if (coeff < 1.0) grad_scale = static_cast<float>(coeff);
    }
    pm.optimizer->step(grads, learning_rate(cfg_.optimizer, iteration_), grad_scale, s);
  }
  // FP8: the step's amaxes (max over micro-batches, reduced over TP and data x context parallel)
  // enter the delayed-scaling histories, and the next step casts the updated weights afresh.
  // Before the gather: --fp8-param-gather casts the weight shards with the next step's scales.
  if (pm.model_parallel.fp8)
    pm.model_parallel.fp8->finish_step(pm.model_parallel.tp.get(), pm.grad_group.get(), s);
  // The updated weights, where another rank owns them. With --fp8-param-gather also after a
  // skipped step: the codes must carry the next step's scale (the weights' other copies on this
  // rank are not refreshed by that gather).
  if (!out.skipped || cfg_.fp8.param_gather) pm.data_parallel->start_param_gather();
  s.synchronize();
  ++iteration_;
  consumed_samples_ += tc.global_batch_size;
  out.iteration = iteration_;
  out.consumed_samples = consumed_samples_;
  out.lr = learning_rate(cfg_.optimizer, iteration_);
  out.elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

IterationMetrics::Moe Trainer::finish_moe_step() {
  ParallelModel& pm = *pm_;
  const Stream& s = pm.runtime.stream;
  const MoeConfig& mc = cfg_.model.moe;
  MoeStepState& st = *pm.moe;
  // Each rank holds its share (its rows, its micro-batches, its layers; zeros elsewhere).
  if (pm.world && pm.world->size() > 1) {
    pm.world->all_reduce(st.stats, comm::ReduceOp::Sum, s);
    pm.world->synchronize(s);
  }
  const std::vector<float> stats = st.stats.to_floats(s);
  const int64_t experts = mc.num_experts, cols = MoeStepState::stat_columns(mc.num_experts);
  const double micro_batches = static_cast<double>(cfg_.training.global_batch_size) /
                               static_cast<double>(cfg_.training.micro_batch_size);
  IterationMetrics::Moe m;
  m.enabled = true;
  double routed = 0, kept = 0;
  int layers = 0;
  for (int l = 0; l < cfg_.model.num_layers; ++l) {
    if (!mc.is_moe_layer(l)) continue;
    const float* row = stats.data() + l * cols;
    double sum = 0, most = 0;
    for (int64_t e = 0; e < experts; ++e) {
      routed += row[e];
      sum += row[experts + e];
      most = std::max(most, static_cast<double>(row[experts + e]));
    }
    kept += sum;
    const double load = sum > 0 ? most / (sum / static_cast<double>(experts)) : 0.0;
    m.load_max_over_mean_per_layer.push_back(load);
    m.load_max_over_mean += load;
    m.aux_loss += row[2 * experts] / micro_batches;
    m.z_loss += row[2 * experts + 1] / micro_batches;
    ++layers;
    // Aux-loss-free balancing (--moe-router-enable-expert-bias): every rank holding the layer
    // moves its bias the same way, from the global counts.
    Tensor& bias = st.expert_bias[static_cast<size_t>(l)];
    if (!bias.defined()) continue;
    std::vector<float> b = bias.to_floats(s);
    const double mean = sum / static_cast<double>(experts);
    for (int64_t e = 0; e < experts; ++e) {
      const double offset = mean - row[experts + e];
      b[static_cast<size_t>(e)] += mc.bias_update_rate * static_cast<float>((offset > 0) - (offset < 0));
    }
    Tensor host = Tensor::from_floats(b, {experts});
    copy_tensor(host, bias, s);
  }
  if (layers > 0) {
    m.load_max_over_mean /= layers;
    m.aux_loss /= layers;
    m.z_loss /= layers;
  }
  m.dropped_fraction = routed > 0 ? 1.0 - kept / routed : 0.0;
  return m;
}

void Trainer::log_interval(const std::vector<IterationMetrics>& window) {
  const Stream& s = pm_->runtime.stream;
  training_log_.iteration(window, skipped_iterations_, nan_iterations_, flops_per_iteration_,
                          peak_memory_gb(s), peak_reserved_memory_gb(s), s.device().str(), predicted_peak_gb_);
  const std::string stats = fault_detector_.stats_report();  // --rerun-mode report_stats
  if (!stats.empty()) logging::info(stats);
}

std::vector<IterationMetrics> Trainer::train() {
  std::vector<IterationMetrics> all, window;
  const int64_t total = cfg_.training.train_iters;
  const int log_every = std::max(1, cfg_.training.log_interval);
  // --profile (Megatron's semantics): start before the step that follows profile_step_start
  // completed iterations, stop after profile_step_end of them, on the --profile-ranks.
  const TrainingConfig& tc = cfg_.training;
  const int64_t rank = pm_->world ? pm_->world->rank() : 0;
  const bool profiling = tc.profile && std::find(tc.profile_ranks.begin(), tc.profile_ranks.end(), rank) !=
                                           tc.profile_ranks.end();
  const Device device = pm_->runtime.stream.device();
  while (iteration_ < total) {
    if (profiling && iteration_ == tc.profile_step_start) cuda_profiler_range(device, true);
    IterationMetrics m = step();
    if (profiling && iteration_ == tc.profile_step_end) cuda_profiler_range(device, false);
    all.push_back(m);
    if (!memory_logged_) {  // the first iteration has touched everything a step holds
      memory_logged_ = true;
      const Stream& s = pm_->runtime.stream;
      if (predicted_peak_gb_ >= 0)
        training_log_.memory_check(predicted_peak_gb_, peak_memory_gb(s), s.is_cuda() ? peak_reserved_memory_gb(s) : -1,
                                   iteration_);
    }
    window.push_back(m);
    training_log_.step(m);  // the per-iteration series (TensorBoard)
    if (iteration_ % log_every == 0 || iteration_ == total) {
      log_interval(window);
      window.clear();
    }
    const int eval_every = cfg_.training.eval_interval;
    if (valid_ && cfg_.training.eval_iters > 0 && eval_every > 0 && iteration_ % eval_every == 0)
      evaluate_and_log(*valid_, "iteration " + std::to_string(iteration_), "validation_lm_loss");
    // Saves on schedule; --exit-interval, SIGTERM/SIGUSR1 and --exit-duration-in-mins stop here.
    if (checkpoint_boundary()) {
      pm_->data_parallel->finish_param_gather();
      finish_checkpoints(/*exiting=*/true);
      return all;
    }
  }
  pm_->data_parallel->finish_param_gather();
  finish_checkpoints();
  // Megatron ends with a pass over the validation and the test data.
  if (valid_ && cfg_.training.eval_iters > 0)
    evaluate_and_log(*valid_, "iteration " + std::to_string(iteration_) + " on validation set",
                     "validation_lm_loss");
  if (test_ && cfg_.training.eval_iters > 0)
    evaluate_and_log(*test_, "iteration " + std::to_string(iteration_) + " on test set", "test_lm_loss");
  log_peak_memory_per_stage();
  return all;
}

void Trainer::log_peak_memory_per_stage() {
  if (!pm_->pipeline || pm_->pp_size == 1) return;
  // Each stage holds different layers (and the first/last the embedding/head): one number each.
  const Stream& s = pm_->runtime.stream;
  Tensor mine = Tensor::from_floats({static_cast<float>(peak_memory_gb(s))}, {1});
  Tensor all = Tensor::zeros({pm_->pp_size}, DType::F32, s);
  if (!s.device().is_cpu()) mine = mine.to(s.device(), s);
  pm_->pipeline->all_gather(mine, all, s);
  pm_->pipeline->synchronize(s);
  training_log_.peak_memory_per_stage(all.to_floats(s), iteration_);
}

}  // namespace megadlm
