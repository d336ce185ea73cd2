#include "megadlm/training/training_log.h"
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <nlohmann/json.hpp>
#include "megadlm/core/error.h"
#include "megadlm/core/tensor.h"
#include "megadlm/training/flops.h"
#include "megadlm/training/tensorboard_writer.h"

namespace megadlm {

namespace {

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

double peak_memory_gb(const Stream& stream) {
  if (stream.is_cuda()) return static_cast<double>(cuda_peak_memory_bytes(stream.device())) / 1e9;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0 / 1e9;  // ru_maxrss is in KiB on Linux
}

double peak_reserved_memory_gb(const Stream& stream) {
  return stream.is_cuda() ? static_cast<double>(cuda_peak_reserved_memory_bytes(stream.device())) / 1e9
                          : 0.0;
}

TrainingLog::TrainingLog(const RunConfig& config, std::ostream& log, bool logging_rank)
    : cfg_(config), log_(log), logging_rank_(logging_rank) {
  const TrainingConfig& tc = cfg_.training;
  if (!tc.tensorboard_dir.empty() && logging_rank_)
    tensorboard_ = std::make_unique<training::TrainingTensorBoard>(training::TensorBoardOptions{
        tc.tensorboard_dir, tc.tensorboard_log_interval, tc.log_timers_to_tensorboard, tc.log_throughput,
        tc.log_memory_to_tensorboard, tc.log_validation_ppl_to_tensorboard});
}

TrainingLog::~TrainingLog() = default;

void TrainingLog::step(const IterationMetrics& m) const {
  if (tensorboard_)
    tensorboard_->iteration(m.iteration, m.consumed_samples, m.lm_loss, m.lr, m.grad_norm,
                            cfg_.training.global_batch_size);
}

void TrainingLog::check_metrics_file() const {
  if (cfg_.training.metrics_jsonl.empty() || !logging_rank_) return;
  std::ofstream probe(cfg_.training.metrics_jsonl, std::ios::app);
  MDLM_CHECK(probe.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl,
             ": cannot open the file for appending");
}

void TrainingLog::append_metrics(const std::string& json_line, const std::string& what) const {
  if (cfg_.training.metrics_jsonl.empty()) return;
  // The whole row or nothing: written, flushed and closed with every error checked (an
  // ofstream reports a full disk only when its buffer is flushed, at the close its destructor
  // does silently), and a row cut short is cut off again, so the file stays one JSON object per
  // line. A failed write stops the run: the metrics asked for are not lost without a word.
  const std::string& path = cfg_.training.metrics_jsonl;
  const std::string row = json_line + "\n";
  std::string error;
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = std::strerror(errno);
  } else {
    struct stat st {};
    const off_t before = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : -1;
    size_t done = 0;
    while (done < row.size() && error.empty()) {
      const ssize_t n = ::write(fd, row.data() + done, row.size() - done);
      if (n > 0) done += static_cast<size_t>(n);
      else if (n < 0 && errno == EINTR) continue;
      else error = n < 0 ? std::strerror(errno) : "the write made no progress";
    }
    if (!error.empty() && done > 0 && before >= 0 && ::ftruncate(fd, before) != 0) {
      error += "; the partial row could not be removed (" + std::string(std::strerror(errno)) + ")";
    }
    if (::close(fd) != 0 && error.empty()) error = std::strerror(errno);
  }
  if (!error.empty())
    MDLM_FAIL("--metrics-jsonl ", path, ": writing ", what, " failed (", error, "). The run stops rather than "
              "lose its metrics silently: free space (or fix the file), then resume from the last checkpoint; "
              "or run without --metrics-jsonl");
}

void TrainingLog::startup(const std::string& text) const {
  if (logging_rank_) log_ << text;
}

void TrainingLog::iteration(const std::vector<IterationMetrics>& window, int64_t skipped_iterations,
                            int64_t nan_iterations, double flops_per_iteration, double peak_gb,
                            double peak_reserved_gb, const std::string& device, double predicted_gb) const {
  if (window.empty() || !logging_rank_) return;
  const IterationMetrics& last = window.back();
  double loss = 0, ms = 0;
  int counted = 0;
  IterationMetrics::Moe moe;  // window averages, like the loss
  for (const IterationMetrics& m : window) {
    ms += m.elapsed_ms;
    if (!m.skipped) {
      loss += m.lm_loss;
      ++counted;
    }
    if (m.moe.enabled) {
      moe.enabled = true;
      moe.aux_loss += m.moe.aux_loss / static_cast<double>(window.size());
      moe.z_loss += m.moe.z_loss / static_cast<double>(window.size());
      moe.load_max_over_mean += m.moe.load_max_over_mean / static_cast<double>(window.size());
      moe.dropped_fraction += m.moe.dropped_fraction / static_cast<double>(window.size());
    }
  }
  loss = counted ? loss / counted : NAN;  // Megatron averages the loss over the interval
  ms /= static_cast<double>(window.size());
  const int world = cfg_.parallel.world_size;
  const double tflops = flops_per_iteration / (ms / 1e3) / 1e12 / world;
  const double tokens_per_s = static_cast<double>(cfg_.training.global_batch_size) *
                              cfg_.model.seq_length / (ms / 1e3);
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
       << " number of skipped iterations: " << std::setw(3) << skipped_iterations << " |"
       << " number of nan iterations: " << std::setw(3) << nan_iterations << " |";
  // MoE fields after Megatron's, so that parsers of the line above keep working.
  const MoeConfig& mc = cfg_.model.moe;
  if (moe.enabled) {
    if (mc.load_balancing != MoeLoadBalancing::None && mc.load_balancing != MoeLoadBalancing::Sinkhorn)
      line << " load_balancing_loss: " << sci(moe.aux_loss) << " |";
    if (mc.z_loss_coeff != 0.0f) line << " z_loss: " << sci(moe.z_loss) << " |";
    line << " expert load max/mean: " << std::setprecision(3) << moe.load_max_over_mean << " |";
    if (mc.capacity_factor) line << " dropped tokens: " << std::setprecision(4) << moe.dropped_fraction << " |";
  }
  // Not in Megatron's line: appended last so that parsers of its fields keep working.
  line << " estimated time left: " << hms(eta_s) << " |";
  log_ << line.str() << std::endl;
  if (tensorboard_) tensorboard_->interval(last.iteration, ms / 1e3, tflops, peak_gb * 1e9);
  nlohmann::json j;
  j["kind"] = "train";  // docs/metrics.md
  j["iteration"] = last.iteration;
  j["lm_loss"] = loss;
  j["grad_norm"] = last.grad_norm;
  j["lr"] = last.lr;
  j["consumed_samples"] = last.consumed_samples;
  j["elapsed_ms"] = ms;
  j["tokens_per_s"] = tokens_per_s;
  j["tflops_per_gpu"] = tflops;
  j["mfu"] = tflops / kH200PeakTflops;
  j["mfu_989"] = tflops / kH200DatasheetTflops;
  j["peak_mem_gb"] = peak_gb;
  if (peak_reserved_gb > 0) j["peak_reserved_gb"] = peak_reserved_gb;
  if (predicted_gb >= 0) j["predicted_peak_gb"] = predicted_gb;
  j["skipped_iterations"] = skipped_iterations;
  j["nan_iterations"] = nan_iterations;
  j["global_batch_size"] = cfg_.training.global_batch_size;
  j["device"] = device;
  if (moe.enabled) {
    j["moe_load_balancing_loss"] = moe.aux_loss;
    j["moe_z_loss"] = moe.z_loss;
    j["moe_load_max_over_mean"] = moe.load_max_over_mean;
    j["moe_dropped_fraction"] = moe.dropped_fraction;
    j["moe_load_max_over_mean_per_layer"] = last.moe.load_max_over_mean_per_layer;
  }
  append_metrics(j.dump(), "the row of iteration " + std::to_string(last.iteration));
}

void TrainingLog::validation(double loss, const std::string& what, const std::string& key,
                             int64_t iteration, int64_t consumed_samples) const {
  if (!logging_rank_) return;
  // Megatron: ' validation loss at <what> | lm loss value: X | lm loss PPL: Y | ' between rules.
  const std::string line = " validation loss at " + what + " | lm loss value: " + sci(loss) +
                           " | lm loss PPL: " + sci(std::exp(std::min(20.0, loss))) + " | ";
  const std::string rule(line.size() + 1, '-');
  log_ << rule << "\n" << line << "\n" << rule << std::endl;
  if (tensorboard_)
    tensorboard_->validation(key.rfind("test", 0) == 0 ? "test" : "validation", iteration, consumed_samples, loss);
  nlohmann::json j;
  j["kind"] = key.substr(0, key.find("_lm_loss"));  // "validation" or "test"
  j["iteration"] = iteration;
  j[key] = loss;
  j[key.substr(0, key.find("_lm_loss")) + "_ppl"] = std::exp(std::min(20.0, loss));
  j["consumed_samples"] = consumed_samples;
  append_metrics(j.dump(), "the " + j["kind"].get<std::string>() + " row of iteration " + std::to_string(iteration));
}

void TrainingLog::memory_check(double predicted_gb, double measured_gb, double reserved_gb,
                               int64_t iteration) const {
  if (!logging_rank_) return;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << " > peak memory by step " << iteration
       << " (GB): predicted peak " << predicted_gb << " | measured peak " << measured_gb;
  if (reserved_gb >= 0) line << " | reserved " << reserved_gb;
  else line << " (resident set of the process)";
  if (predicted_gb > 0) line << " | measured / predicted " << std::setprecision(3) << measured_gb / predicted_gb;
  log_ << line.str() << std::endl;
}

void TrainingLog::peak_memory_per_stage(const std::vector<float>& gb, int64_t iteration) const {
  if (!logging_rank_) return;
  std::ostringstream line;
  line << " > peak memory per pipeline stage (GB):";
  for (float g : gb) line << " " << std::fixed << std::setprecision(1) << g;
  log_ << line.str() << std::endl;
  nlohmann::json j;
  j["kind"] = "memory";
  j["iteration"] = iteration;
  j["peak_mem_gb_per_stage"] = gb;
  append_metrics(j.dump(), "the memory row of iteration " + std::to_string(iteration));
}

}  // namespace megadlm
