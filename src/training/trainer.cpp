#include "megadlm/training/trainer.h"
#include <sys/resource.h>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/training/flops.h"
#include "megadlm/training/lr_schedule.h"

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

std::string sci(double v) {  // Megatron's {:.6E}
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6E", v);
  return buf;
}

}  // namespace

Trainer::Trainer(const RunConfig& config, std::shared_ptr<const SampleSource> data, std::ostream& log)
    : cfg_(config), data_(std::move(data)), log_(log) {
  MDLM_CHECK(data_ != nullptr, "Trainer needs a sample source");
  const bool cuda = cfg_.training.device == DeviceKind::Cuda;
  rt_.stream = Stream::for_device(cuda ? Device::cuda(0) : Device::cpu());
  rt_.dtype = cuda ? DType::BF16 : DType::F32;
  rt_.seed = cfg_.training.seed;
  rt_.training = true;
  model_ = std::make_unique<GptModel>(cfg_.model, store_);
  store_.materialize(rt_.dtype, cfg_.training.seed, rt_.stream);
  rt_.stream.synchronize();
  flops_per_iteration_ = megatron_flops_per_iteration(cfg_.model, cfg_.training.global_batch_size);
  log_ << " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
       << store_.num_parameters() << "\n"
       << " > device: " << rt_.stream.device().str() << ", model dtype "
       << dtype_name(rt_.dtype) << ", fp32 master weights and gradients\n";
  if (!cfg_.training.metrics_jsonl.empty()) {
    std::ofstream probe(cfg_.training.metrics_jsonl, std::ios::app);
    MDLM_CHECK(probe.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl,
               ": cannot open the file for appending");
  }
}

Trainer::~Trainer() = default;

IterationMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const Stream& s = rt_.stream;
  const TrainingConfig& tc = cfg_.training;
  const int64_t mbs = tc.micro_batch_size;
  const int64_t num_mb = tc.num_micro_batches(cfg_.parallel.data_parallel_size);
  const int64_t first = consumed_samples_;

  // 1. Host micro-batches of the whole global batch and the global normaliser.
  BatchContext ctx;
  ctx.seed = tc.seed;
  ctx.micro_batch_size = mbs;
  ctx.training = true;
  ctx.bidirectional = cfg_.model.attention_mask == AttentionMaskType::NoMask;
  ctx.eod_token = data_->eod_token();
  ctx.eod_mask_loss = cfg_.data.eod_mask_loss;
  std::vector<HostMicroBatch> host(static_cast<size_t>(num_mb));
  double loss_tokens = 0;
  for (int64_t m = 0; m < num_mb; ++m) {
    std::vector<std::vector<int32_t>> samples;
    samples.reserve(static_cast<size_t>(mbs));
    const int64_t mb_first = first + m * mbs;
    for (int64_t b = 0; b < mbs; ++b) samples.push_back(data_->sample(mb_first + b));
    host[static_cast<size_t>(m)] = build_micro_batch(samples, mb_first, cfg_.diffusion, ctx);
    loss_tokens += host[static_cast<size_t>(m)].loss_tokens;
  }
  MDLM_CHECK(loss_tokens > 0, "iteration ", iteration_ + 1,
             ": the global batch has no token to train on (every loss-mask entry is 0)");

  // 2. Forward and backward of every micro-batch; gradients accumulate.
  store_.zero_grads(s);
  Tensor loss_sum = Tensor::zeros({1}, DType::F32, s);
  const float grad_scale = static_cast<float>(1.0 / loss_tokens);
  for (const HostMicroBatch& h : host) {
    MicroBatch mb = MicroBatch::upload(h, s);
    ModelRecord rec;
    model_->forward(mb, rec, loss_sum, grad_scale, rt_);
    model_->backward(mb, rec, rt_);
  }

  // 3-4. Loss and gradient norm (one host sync each).
  IterationMetrics out;
  out.lm_loss = static_cast<double>(loss_sum.to_floats(s)[0]) / loss_tokens;
  Tensor sq = Tensor::zeros({1}, DType::F32, s);
  Tensor grads = store_.flat_grads();
  ops::sum_squares(grads, sq, s);
  out.grad_norm = std::sqrt(static_cast<double>(sq.to_floats(s)[0]));
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
    // 5. Clip, then AdamW on the decayed and non-decayed regions of the flat buffers.
    const double clip = cfg_.optimizer.clip_grad;
    if (clip > 0) {
      const double coeff = clip / (out.grad_norm + 1e-6);
      if (coeff < 1.0) ops::scale_inplace(grads, static_cast<float>(coeff), s);
    }
    ++adam_steps_;
    const double lr = learning_rate(cfg_.optimizer, iteration_);
    const int64_t split = store_.decay_size();
    const int64_t total = store_.flat_size();
    for (int region = 0; region < 2; ++region) {
      const int64_t off = region == 0 ? 0 : split;
      const int64_t len = region == 0 ? split : total - split;
      if (len == 0) continue;
      ops::AdamWArgs a;
      a.lr = static_cast<float>(lr);
      a.beta1 = cfg_.optimizer.adam_beta1;
      a.beta2 = cfg_.optimizer.adam_beta2;
      a.eps = cfg_.optimizer.adam_eps;
      a.weight_decay = region == 0 ? cfg_.optimizer.weight_decay : 0.0f;
      a.step = adam_steps_;
      Tensor master = store_.flat_master().slice_flat(off, {len});
      Tensor g = grads.slice_flat(off, {len});
      Tensor m = store_.flat_exp_avg().slice_flat(off, {len});
      Tensor v = store_.flat_exp_avg_sq().slice_flat(off, {len});
      Tensor model = store_.master_is_param() ? Tensor() : store_.flat_params().slice_flat(off, {len});
      ops::adamw_step(master, g, m, v, model, a, s);
    }
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
  if (window.empty()) return;
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
       << " number of nan iterations: " << std::setw(3) << nan_iterations_ << " |";
  log_ << line.str() << std::endl;
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
    if (iteration_ % log_every == 0 || iteration_ == total) {
      log_interval(window);
      window.clear();
    }
    if (cfg_.training.exit_interval && iteration_ % *cfg_.training.exit_interval == 0) {
      log_ << " exiting program at iteration " << iteration_ << " (--exit-interval)" << std::endl;
      break;
    }
  }
  return all;
}

}  // namespace megadlm
