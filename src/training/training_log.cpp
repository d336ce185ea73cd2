#include "megadlm/training/training_log.h"
#include <sys/resource.h>
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

double peak_reserved_gb(const Stream& stream) {
  return stream.is_cuda() ? static_cast<double>(cuda_peak_reserved_bytes(stream.device())) / 1e9 : 0.0;
}

TrainingLog::TrainingLog(const RunConfig& config, std::ostream& log, bool logging_rank)
    : cfg_(config), log_(log), logging_rank_(logging_rank) {}

void TrainingLog::check_metrics_file() const {
  if (cfg_.training.metrics_jsonl.empty() || !logging_rank_) return;
  std::ofstream probe(cfg_.training.metrics_jsonl, std::ios::app);
  MDLM_CHECK(probe.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl,
             ": cannot open the file for appending");
}

void TrainingLog::append_metrics(const std::string& json_line) const {
  if (cfg_.training.metrics_jsonl.empty()) return;
  std::ofstream f(cfg_.training.metrics_jsonl, std::ios::app);
  f << json_line << "\n";
  MDLM_CHECK(f.good(), "--metrics-jsonl ", cfg_.training.metrics_jsonl, ": write failed");
}

void TrainingLog::startup(const std::string& text) const {
  if (logging_rank_) log_ << text;
}

void TrainingLog::iteration(const std::vector<IterationMetrics>& window, int64_t skipped_iterations,
                            int64_t nan_iterations, double flops_per_iteration, double peak_gb,
                            const std::string& device, double predicted_gb, double reserved_gb) const {
  if (window.empty() || !logging_rank_) return;
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
  const double tflops = flops_per_iteration / (ms / 1e3) / 1e12 / world;
  const double tokens_per_s = static_cast<double>(cfg_.training.global_batch_size) *
                              cfg_.model.seq_length / (ms / 1e3);
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
  log_ << line.str() << std::endl;
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
  j["peak_mem_gb"] = peak_gb;
  if (predicted_gb >= 0) j["predicted_peak_gb"] = predicted_gb;
  if (reserved_gb >= 0) j["reserved_peak_gb"] = reserved_gb;
  j["skipped_iterations"] = skipped_iterations;
  j["nan_iterations"] = nan_iterations;
  j["global_batch_size"] = cfg_.training.global_batch_size;
  j["device"] = device;
  append_metrics(j.dump());
}

void TrainingLog::validation(double loss, const std::string& what, const std::string& key,
                             int64_t iteration, int64_t consumed_samples) const {
  if (!logging_rank_) return;
  // Megatron: ' validation loss at <what> | lm loss value: X | lm loss PPL: Y | ' between rules.
  const std::string line = " validation loss at " + what + " | lm loss value: " + sci(loss) +
                           " | lm loss PPL: " + sci(std::exp(std::min(20.0, loss))) + " | ";
  const std::string rule(line.size() + 1, '-');
  log_ << rule << "\n" << line << "\n" << rule << std::endl;
  nlohmann::json j;
  j["iteration"] = iteration;
  j[key] = loss;
  j[key.substr(0, key.find("_lm_loss")) + "_ppl"] = std::exp(std::min(20.0, loss));
  j["consumed_samples"] = consumed_samples;
  append_metrics(j.dump());
}

void TrainingLog::memory_check(double predicted_gb, double measured_gb, double reserved_gb,
                               int64_t iteration) const {
  if (!logging_rank_) return;
  std::ostringstream line;
  line << std::fixed << std::setprecision(2) << " > memory after iteration " << iteration
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
  j["iteration"] = iteration;
  j["peak_mem_gb_per_stage"] = gb;
  if (cfg_.training.metrics_jsonl.empty()) return;
  std::ofstream f(cfg_.training.metrics_jsonl, std::ios::app);
  f << j.dump() << "\n";
}

}  // namespace megadlm
