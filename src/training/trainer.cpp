#include "megadlm/training/trainer.h"
#include <sys/resource.h>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/parallel/pipeline_parallel/layer_partition.h"
#include "megadlm/parallel/pipeline_parallel/schedule.h"
#include "megadlm/training/flops.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/diffusion/sft_process.h"
#include "megadlm/training/lr_schedule.h"
#include "megadlm/training/tensorboard_writer.h"

namespace megadlm {

namespace {

double peak_memory_gb(const ModelRuntime& rt) {
  if (rt.stream.is_cuda()) return static_cast<double>(cuda_peak_memory_bytes(rt.stream.device())) / 1e9;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0 / 1e9;  // ru_maxrss is in KiB on Linux
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// h:mm:ss for the estimated time left.
std::string hms(double seconds) {
  const long long s = std::max(0LL, static_cast<long long>(std::llround(seconds)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

std::string sci(double v) {  // Megatron's {:.6E}
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6E", v);
  return buf;
}

}  // namespace

Trainer::Trainer(const RunConfig& config, std::shared_ptr<const SampleSource> data,
                 std::ostream& log, const comm::ProcessGroups* groups)
    : cfg_(config), data_(std::move(data)), log_(log) {
  MDLM_CHECK(data_ != nullptr, "Trainer needs a sample source");
  const bool cuda = cfg_.training.device == DeviceKind::Cuda;
  if (groups != nullptr) {
    dp_group_ = groups->dp_cp;
    world_ = groups->world;
    rank_ = groups->world ? groups->world->rank() : 0;
    MDLM_CHECK(!dp_group_ || dp_group_->size() == cfg_.parallel.data_parallel_size *
                                                      cfg_.parallel.context_parallel_size,
               "the dp-cp group has ", dp_group_->size(), " ranks but the configuration says dp ",
               cfg_.parallel.data_parallel_size, " x cp ", cfg_.parallel.context_parallel_size);
  }
  const int dp_size = dp_group_ ? dp_group_->size() : 1;
  rt_.stream = Stream::for_device(cuda ? (dp_group_ ? dp_group_->device() : Device::cuda(0))
                                       : Device::cpu());
  rt_.dtype = cuda ? DType::BF16 : DType::F32;
  rt_.seed = cfg_.training.seed;
  rt_.training = true;
  TensorParallelLayout tpl;
  if (groups != nullptr && groups->tp) {
    rt_.tp = groups->tp.get();
    tpl.rank = groups->tp->rank();
    tpl.size = groups->tp->size();
  }
  MDLM_CHECK(tpl.size == cfg_.parallel.tensor_model_parallel_size, "the tp group has ", tpl.size,
             " ranks but --tensor-model-parallel-size is ", cfg_.parallel.tensor_model_parallel_size);
  tpl.sequence_parallel = cfg_.parallel.sequence_parallel && tpl.size > 1;
  // Pipeline: this rank's chunks of layers (several with virtual stages); the first virtual
  // stage holds the embedding, the last one the head.
  if (groups != nullptr && groups->pp) {
    pp_group_ = groups->pp;
    pp_rank_ = pp_group_->rank();
    pp_size_ = pp_group_->size();
  }
  MDLM_CHECK(pp_size_ == cfg_.parallel.pipeline_model_parallel_size, "the pp group has ", pp_size_,
             " ranks but --pipeline-model-parallel-size is ", cfg_.parallel.pipeline_model_parallel_size);
  const int vpp = std::max(1, cfg_.parallel.virtual_pipeline_model_parallel_size);
  const auto ranges = pp::stage_layers(cfg_.model.num_layers, pp_size_, vpp, pp_rank_,
                                       cfg_.parallel.decoder_first_pipeline_num_layers,
                                       cfg_.parallel.decoder_last_pipeline_num_layers);
  for (int c = 0; c < static_cast<int>(ranges.size()); ++c) {
    ModelChunkSpec spec;
    spec.embedding = pp_rank_ == 0 && c == 0;
    spec.head = pp_rank_ == pp_size_ - 1 && c == static_cast<int>(ranges.size()) - 1;
    spec.first_layer = ranges[static_cast<size_t>(c)].first;
    spec.num_layers = ranges[static_cast<size_t>(c)].count;
    models_.push_back(std::make_unique<GptModel>(cfg_.model, store_, tpl, spec));
  }

  DataParallelOptions dpo;
  dpo.overlap_grad_reduce = cfg_.parallel.overlap_grad_reduce;
  dpo.distributed_optimizer = cfg_.parallel.use_distributed_optimizer;
  dpo.overlap_param_gather = cfg_.parallel.overlap_param_gather;
  dpo.bucket_size = cfg_.parallel.ddp_bucket_size;
  const int shard_size =
      groups != nullptr && dpo.distributed_optimizer && groups->dist_opt_intra
          ? groups->dist_opt_intra->size() : dp_size;
  store_.materialize(rt_.dtype, cfg_.training.seed, rt_.stream,
                     DataParallel::buffer_layout(dpo, shard_size));
  // Gradients reduce over dp-cp; with several distributed-optimizer instances the shards live
  // in the intra-instance group and are all-reduced across instances.
  std::shared_ptr<comm::Communicator> shard_group = dp_group_, inter_group;
  if (groups != nullptr && dpo.distributed_optimizer && groups->dist_opt_intra) {
    shard_group = groups->dist_opt_intra;
    inter_group = groups->dist_opt_inter;
    dist_opt_inter_ = inter_group;
  }
  dp_ = std::make_unique<DataParallel>(store_, shard_group, dpo, rt_.stream, inter_group,
                                       groups != nullptr ? groups->tp : nullptr, pp_group_,
                                       groups != nullptr ? groups->embedding : nullptr);
  optimizer_ = std::make_unique<AdamWOptimizer>(store_, dp_->owned_ranges(), cfg_.optimizer, rt_.stream);
  rt_.hooks = dp_.get();
  rt_.stream.synchronize();
  flops_per_iteration_ = megatron_flops_per_iteration(cfg_.model, cfg_.training.global_batch_size);
  if (logging_rank()) {
    log_ << " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
         << store_.num_parameters() << "\n"
         << " > device: " << rt_.stream.device().str() << ", model dtype " << dtype_name(rt_.dtype)
         << ", fp32 master weights and gradients; pipeline-parallel size " << pp_size_
         << (vpp > 1 ? " x " + std::to_string(vpp) + " virtual stages" : std::string())
         << ", tensor-parallel size " << tpl.size
         << (tpl.sequence_parallel ? " (sequence parallel)" : "") << ", data-parallel size " << dp_size
         << (dpo.distributed_optimizer ? ", distributed optimizer" : "")
         << (dpo.overlap_grad_reduce ? ", overlapped gradient reduction" : "") << ", "
         << store_.buckets().size() << " gradient bucket(s)\n";
  }
  if (!cfg_.training.metrics_jsonl.empty() && logging_rank()) {
    std::ofstream probe(cfg_.training.metrics_jsonl, std::ios::app);
    MDLM_CHECK(probe.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl,
               ": cannot open the file for appending");
  }
  const TrainingConfig& tc = cfg_.training;
  if (!tc.tensorboard_dir.empty() && logging_rank())
    tensorboard_ = std::make_unique<training::TrainingTensorBoard>(training::TensorBoardOptions{
        tc.tensorboard_dir, tc.tensorboard_log_interval, tc.log_timers_to_tensorboard, tc.log_throughput,
        tc.log_memory_to_tensorboard, tc.log_validation_ppl_to_tensorboard});
  load_checkpoint();
}

double Trainer::dp_sum(double local) {
  if (!dp_group_ || dp_group_->size() == 1) return local;
  const Stream& s = rt_.stream;
  Tensor t = Tensor::from_floats({0.0f}, {1}, DType::F64);
  t.data<double>()[0] = local;
  if (!s.device().is_cpu()) t = t.to(s.device(), s);
  dp_group_->all_reduce(t, comm::ReduceOp::Sum, s);
  dp_group_->synchronize(s);
  Tensor host = t.to(Device::cpu(), s);
  return host.data<double>()[0];
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
  const int64_t dp = dp_group_ ? dp_group_->size() : 1;
  const int64_t dp_rank = dp_group_ ? dp_group_->rank() : 0;
  const int64_t num_mb = cfg_.training.num_micro_batches(static_cast<int>(dp));
  std::vector<HostMicroBatch> host(static_cast<size_t>(num_mb));
  local_tokens = 0;
  for (int64_t m = 0; m < num_mb; ++m) {
    std::vector<std::vector<int32_t>> samples;
    samples.reserve(static_cast<size_t>(mbs));
    const int64_t mb_first = first + m * mbs * dp + dp_rank * mbs;
    for (int64_t b = 0; b < mbs; ++b) samples.push_back(data.sample(mb_first + b));
    if (cfg_.diffusion.sft) {  // prompt/response data: masks on the response only
      std::vector<int64_t> prompts;
      for (int64_t b = 0; b < mbs; ++b) prompts.push_back(data.prompt_length(mb_first + b));
      host[static_cast<size_t>(m)] = build_sft_micro_batch(samples, prompts, mb_first, cfg_.diffusion, ctx);
    } else {
      host[static_cast<size_t>(m)] = build_micro_batch(samples, mb_first, cfg_.diffusion, ctx);
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
  const Stream& s = rt_.stream;
  dp_->finish_param_gather();  // the weights of the last update must be in place
  rt_.training = false;        // no dropout
  const BatchContext ctx = batch_context(false);
  double num = 0, den = 0;
  for (int64_t it = 0; it < cfg_.training.eval_iters; ++it) {
    double local_tokens = 0;
    std::vector<HostMicroBatch> host = host_micro_batches(
        data, it * static_cast<int64_t>(cfg_.training.global_batch_size), ctx, local_tokens);
    Tensor loss_sum = Tensor::zeros({1}, DType::F32, s);
    run_schedule(host, loss_sum, 0.0f);  // forward only
    if (pp_group_ && pp_size_ > 1) {  // the loss lives on the last stage
      pp_group_->all_reduce(loss_sum, comm::ReduceOp::Sum, s);
      pp_group_->synchronize(s);
    }
    num += static_cast<double>(loss_sum.to_floats(s)[0]);
    den += local_tokens;
  }
  rt_.training = true;
  num = dp_sum(num);
  den = dp_sum(den);
  return den > 0 ? num / den : NAN;
}

void Trainer::evaluate_and_log(const SampleSource& data, const std::string& what, const char* key) {
  const double loss = evaluate(data);
  if (!logging_rank()) return;
  // Megatron: ' validation loss at <what> | lm loss value: X | lm loss PPL: Y | ' between rules.
  const std::string line = " validation loss at " + what + " | lm loss value: " + sci(loss) +
                           " | lm loss PPL: " + sci(std::exp(std::min(20.0, loss))) + " | ";
  const std::string rule(line.size() + 1, '-');
  log_ << rule << "\n" << line << "\n" << rule << std::endl;
  if (tensorboard_)
    tensorboard_->validation(std::string(key).rfind("test", 0) == 0 ? "test" : "validation", iteration_,
                             consumed_samples_, loss);
  if (!cfg_.training.metrics_jsonl.empty()) {
    nlohmann::json j;
    j["iteration"] = iteration_;
    j[key] = loss;
    j[std::string(key).substr(0, std::string(key).find("_lm_loss")) + "_ppl"] = std::exp(std::min(20.0, loss));
    j["consumed_samples"] = consumed_samples_;
    std::ofstream f(cfg_.training.metrics_jsonl, std::ios::app);
    f << j.dump() << "\n";
    MDLM_CHECK(f.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl, ": write failed");
  }
}

void Trainer::run_schedule(const std::vector<HostMicroBatch>& host, Tensor& loss_sum,
                           float grad_scale) {
  const Stream& s = rt_.stream;
  const int64_t num_mb = static_cast<int64_t>(host.size());
  const int vpp = static_cast<int>(models_.size());
  pp::ScheduleConfig sc;
  sc.pp_rank = pp_rank_;
  sc.pp_size = pp_size_;
  sc.virtual_stages = vpp;
  sc.num_micro_batches = static_cast<int>(num_mb);
  sc.forward_only = grad_scale <= 0;
  sc.microbatch_group_size = cfg_.parallel.microbatch_group_size_per_vp_stage;
  const std::vector<pp::Action> actions = pp::build_schedule(sc);
  using Key = std::pair<int, int>;  // (micro-batch, chunk)
  std::map<int, MicroBatch> uploaded;
  std::map<Key, ModelRecord> records;
  std::map<Key, Tensor> received_input, received_grad, output, input_grad;
  auto batch = [&](int m) -> const MicroBatch& {
    auto it = uploaded.find(m);
    if (it == uploaded.end())
      it = uploaded.emplace(m, MicroBatch::upload(host[static_cast<size_t>(m)], s)).first;
    return it->second;
  };
  auto hidden = [&](int m, int c) {
    const MicroBatch& mb = batch(m);
    return Tensor::empty({models_[static_cast<size_t>(c)]->hidden_rows(mb.tokens()),
                          cfg_.model.hidden_size}, rt_.dtype, s);
  };
  auto take = [](std::map<Key, Tensor>& from, Key k, const char* what) {
    auto it = from.find(k);
    MDLM_CHECK(it != from.end(), "pipeline schedule: no ", what, " for micro-batch ", k.first,
               ", chunk ", k.second);
    Tensor t = it->second;
    from.erase(it);
    return t;
  };
  const int next = (pp_rank_ + 1) % pp_size_, prev = (pp_rank_ + pp_size_ - 1) % pp_size_;
  for (const pp::Action& a : actions) {
    const Key key{a.micro_batch, a.chunk};
    const GptModel* chunk = a.chunk >= 0 ? models_[static_cast<size_t>(a.chunk)].get() : nullptr;
    switch (a.type) {
      case pp::ActionType::Forward: {
        Tensor in = chunk->chunk().embedding ? Tensor() : take(received_input, key, "input");
        Tensor out = chunk->forward(batch(a.micro_batch), in, records[key], loss_sum, grad_scale, rt_);
        if (!chunk->chunk().head) output[key] = out;
        if (grad_scale <= 0) {  // evaluation: nothing to keep for a backward
          records.erase(key);
          if (a.chunk == vpp - 1) uploaded.erase(a.micro_batch);
        }
        break;
      }
      case pp::ActionType::Backward: {
        dp_->set_last_micro_batch(a.micro_batch == num_mb - 1);
        Tensor dout = chunk->chunk().head ? Tensor() : take(received_grad, key, "output gradient");
        Tensor din = chunk->backward(batch(a.micro_batch), dout, records[key], rt_);
        records.erase(key);
        if (!chunk->chunk().embedding) input_grad[key] = din;
        if (a.chunk == 0) uploaded.erase(a.micro_batch);  // its last use on this rank
        break;
      }
      case pp::ActionType::Communicate: {
        std::vector<comm::P2POp> ops;
        for (const pp::Transfer& t : a.transfers) {
          const Key k{t.micro_batch, t.chunk};
          switch (t.kind) {
            case pp::Transfer::Kind::SendNext:
              ops.push_back({comm::P2POp::Kind::Send, take(output, k, "output to send"), next});
              break;
            case pp::Transfer::Kind::SendPrev:
              ops.push_back({comm::P2POp::Kind::Send, take(input_grad, k, "input gradient to send"), prev});
              break;
            case pp::Transfer::Kind::RecvPrev:
              received_input[k] = hidden(t.micro_batch, t.chunk);
              ops.push_back({comm::P2POp::Kind::Recv, received_input[k], prev});
              break;
            case pp::Transfer::Kind::RecvNext:
              received_grad[k] = hidden(t.micro_batch, t.chunk);
              ops.push_back({comm::P2POp::Kind::Recv, received_grad[k], next});
              break;
          }
        }
        // Sent tensors die with `ops` after the call; their memory returns to the pool in
        // stream order, after the transfer.
        if (!ops.empty()) pp_group_->batch_p2p(ops, s);
        break;
      }
    }
  }
  MDLM_CHECK(records.empty() && output.empty() && input_grad.empty() && received_input.empty() &&
                 received_grad.empty(),
             "pipeline schedule left work behind on pipeline rank ", pp_rank_);
}

IterationMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const Stream& s = rt_.stream;
  const TrainingConfig& tc = cfg_.training;
  const int64_t first = consumed_samples_;

  // 1. This rank's host micro-batches and the global normaliser.
  double local_tokens = 0;
  std::vector<HostMicroBatch> host = host_micro_batches(*data_, first, batch_context(true), local_tokens);
  const double loss_tokens = dp_sum(local_tokens);
  MDLM_CHECK(loss_tokens > 0, "iteration ", iteration_ + 1,
             ": the global batch has no token to train on (every loss-mask entry is 0)");

  // 2. The pipeline schedule: forwards and backwards of every (micro-batch, chunk) of this
  //    rank, with the transfers to the neighbouring stages batched as the schedule says.
  store_.zero_grads(s);
  dp_->start_step();
  Tensor loss_sum = Tensor::zeros({1}, DType::F32, s);
  run_schedule(host, loss_sum, static_cast<float>(1.0 / loss_tokens));
  dp_->finish_grad_sync();

  // 3-4. Loss and gradient norm (global).
  IterationMetrics out;
  // Only the last stage has a loss: the sum over the pipeline brings it to every stage.
  if (pp_group_ && pp_size_ > 1) {
    pp_group_->all_reduce(loss_sum, comm::ReduceOp::Sum, s);
    pp_group_->synchronize(s);
  }
  out.lm_loss = dp_sum(static_cast<double>(loss_sum.to_floats(s)[0])) / loss_tokens;
  out.grad_norm = std::sqrt(dp_->grad_sq_norm());
  const bool finite = std::isfinite(out.grad_norm) && std::isfinite(out.lm_loss);
  if (!finite) {
    out.nan = true;
    out.skipped = true;
    ++nan_iterations_;
    ++skipped_iterations_;
    MDLM_CHECK(!tc.check_for_nan_in_loss_and_grad, "iteration ", iteration_ + 1,
               ": found a non-finite value (lm loss ", out.lm_loss, ", grad norm ", out.grad_norm,
               "); the update was not applied. Lower --lr or disable the check with "
               "--no-check-for-nan-in-loss-and-grad");
  } else {
    // 5. Clip, AdamW on this rank's masters, refresh (and gather) the model weights.
    Tensor grads = dp_->optimizer_grads();
    const double clip = cfg_.optimizer.clip_grad;
    if (clip > 0) {
      const double coeff = clip / (out.grad_norm + 1e-6);
      if (coeff < 1.0) ops::scale_inplace(grads, static_cast<float>(coeff), s);
    }
    optimizer_->step(grads, learning_rate(cfg_.optimizer, iteration_), s);
    dp_->start_param_gather();
  }
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

void Trainer::log_interval(const std::vector<IterationMetrics>& window) {
  if (window.empty() || !logging_rank()) return;
  const IterationMetrics& last = window.back();
  double loss = 0, ms = 0;
  int counted = 0;
  for (const IterationMetrics& m : window) {
    ms += m.elapsed_ms;
    if (!m.skipped) {
      loss += m.lm_loss;
      ++counted;
    }
  }
  loss = counted ? loss / counted : NAN;  // Megatron averages the loss over the interval
  ms /= static_cast<double>(window.size());
  const int world = cfg_.parallel.world_size;
  const double tflops = flops_per_iteration_ / (ms / 1e3) / 1e12 / world;
  const double tokens_per_s = static_cast<double>(cfg_.training.global_batch_size) *
                              cfg_.model.seq_length / (ms / 1e3);
  const double peak = peak_memory_gb(rt_);
  const double eta_s = static_cast<double>(cfg_.training.train_iters - last.iteration) * ms / 1e3;
  std::ostringstream line;
  line << " [" << timestamp() << "]"
       << " iteration " << std::setw(8) << last.iteration << "/" << std::setw(8)
       << cfg_.training.train_iters << " |"
       << " consumed samples: " << std::setw(12) << last.consumed_samples << " |"
       << " elapsed time per iteration (ms): " << std::fixed << std::setprecision(1) << ms << " |"
       << " throughput per GPU (TFLOP/s/GPU): " << std::setprecision(1) << tflops << " |"
       << " learning rate: " << sci(last.lr) << " |"
       << " global batch size: " << std::setw(5) << cfg_.training.global_batch_size << " |"
       << " lm loss: " << sci(loss) << " |"
       << " loss scale: 1.0 |"
       << " grad norm: " << std::setprecision(3) << last.grad_norm << " |"
       << " number of skipped iterations: " << std::setw(3) << skipped_iterations_ << " |"
       << " number of nan iterations: " << std::setw(3) << nan_iterations_ << " |"
       // Not in Megatron's line: appended last so that parsers of its fields keep working.
       << " estimated time left: " << hms(eta_s) << " |";
  log_ << line.str() << std::endl;
  if (tensorboard_) tensorboard_->interval(last.iteration, ms / 1e3, tflops, peak * 1e9);
  if (!cfg_.training.metrics_jsonl.empty()) {
    nlohmann::json j;
    j["iteration"] = last.iteration;
    j["lm_loss"] = loss;
    j["grad_norm"] = last.grad_norm;
    j["lr"] = last.lr;
    j["consumed_samples"] = last.consumed_samples;
    j["elapsed_ms"] = ms;
    j["tokens_per_s"] = tokens_per_s;
    j["tflops_per_gpu"] = tflops;
    j["mfu"] = tflops / kH200PeakTflops;
    j["peak_mem_gb"] = peak;
    j["skipped_iterations"] = skipped_iterations_;
    j["nan_iterations"] = nan_iterations_;
    j["global_batch_size"] = cfg_.training.global_batch_size;
    j["device"] = rt_.stream.device().str();
    std::ofstream f(cfg_.training.metrics_jsonl, std::ios::app);
    f << j.dump() << "\n";
    MDLM_CHECK(f.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl, ": write failed");
  }
}

std::vector<IterationMetrics> Trainer::train() {
  std::vector<IterationMetrics> all, window;
  const int64_t total = cfg_.training.train_iters;
  const int log_every = std::max(1, cfg_.training.log_interval);
  while (iteration_ < total) {
    IterationMetrics m = step();
    all.push_back(m);
    window.push_back(m);
    if (tensorboard_)
      tensorboard_->iteration(m.iteration, m.consumed_samples, m.lm_loss, m.lr, m.grad_norm,
                              cfg_.training.global_batch_size);
    if (iteration_ % log_every == 0 || iteration_ == total) {
      log_interval(window);
      window.clear();
    }
    const int eval_every = cfg_.training.eval_interval;
    if (valid_ && cfg_.training.eval_iters > 0 && eval_every > 0 && iteration_ % eval_every == 0)
      evaluate_and_log(*valid_, "iteration " + std::to_string(iteration_), "validation_lm_loss");
    // Saves on schedule; --exit-interval, SIGTERM/SIGUSR1 and --exit-duration-in-mins stop here.
    if (checkpoint_boundary()) {
      dp_->finish_param_gather();
      finish_checkpoints(/*exiting=*/true);
      return all;
    }
  }
  dp_->finish_param_gather();
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
  if (!pp_group_ || pp_size_ == 1) return;
  // Each stage holds different layers (and the first/last the embedding/head): one number each.
  const Stream& s = rt_.stream;
  Tensor mine = Tensor::from_floats({static_cast<float>(peak_memory_gb(rt_))}, {1});
  Tensor all = Tensor::zeros({pp_size_}, DType::F32, s);
  if (!s.device().is_cpu()) mine = mine.to(s.device(), s);
  pp_group_->all_gather(mine, all, s);
  pp_group_->synchronize(s);
  const std::vector<float> gb = all.to_floats(s);
  if (!logging_rank()) return;
  std::ostringstream line;
  line << " > peak memory per pipeline stage (GB):";
  for (float g : gb) line << " " << std::fixed << std::setprecision(1) << g;
  log_ << line.str() << std::endl;
  if (!cfg_.training.metrics_jsonl.empty()) {
    nlohmann::json j;
    j["iteration"] = iteration_;
    j["peak_mem_gb_per_stage"] = gb;
    std::ofstream f(cfg_.training.metrics_jsonl, std::ios::app);
    f << j.dump() << "\n";
  }
}

}  // namespace megadlm
