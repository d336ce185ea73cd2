// TensorBoard event files written natively (docs/monitoring.md; no TensorFlow, no protobuf
// library): the record framing TensorBoard reads (length, masked CRC-32C of the length, the
// serialized Event, masked CRC-32C of the data), a first Event with file_version
// "brain.Event:2", then one Event per scalar in the old-style simple_value form that PyTorch's
// SummaryWriter.add_scalar (what Megatron uses) writes, tags kept as given ("lm loss").
//
// TrainingTensorBoard puts Megatron's series on top (training_log / evaluate_and_print_results):
// every --tensorboard-log-interval iterations learning-rate, batch-size, lm loss, loss-scale,
// grad-norm, each also "<name> vs samples" keyed by consumed samples; at each --log-interval
// iteration-time and throughput with --log-timers-to-tensorboard, mem-max-allocated-bytes with
// --log-memory-to-tensorboard; after each validation "lm loss validation" (+ vs samples) and,
// with --log-validation-ppl-to-tensorboard, "lm loss validation ppl" (+ vs samples).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace megadlm::training {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78).
uint32_t crc32c(const void* data, size_t size);
/// TensorBoard's masked CRC: ((crc >> 15) | (crc << 17)) + 0xA282EAD8.
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  /// Creates `dir` (and parents) and DIR/events.out.tfevents.<unix seconds>.<host>.<pid>.<n>;
  /// throws naming the directory when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One scalar Event at `step` (wall time now).
  void add_scalar(const std::string& tag, double value, int64_t step);
  /// Makes everything written so far visible to readers (and throws on a write error).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  [[noreturn]] void write_failed() const;  // throws naming the flag, the file and errno
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// Megatron's TensorBoard series for a training run (above).
struct TensorBoardOptions {
  std::string dir;                          ///< --tensorboard-dir ("" = off)
  int log_interval = 1;                     ///< --tensorboard-log-interval
  bool log_timers = false;                  ///< --log-timers-to-tensorboard
  bool log_throughput = false;              ///< --log-throughput (throughput needs both)
  bool log_memory = false;                  ///< --log-memory-to-tensorboard
  bool log_validation_ppl = false;          ///< --log-validation-ppl-to-tensorboard
};

class TrainingTensorBoard {
 public:
  explicit TrainingTensorBoard(const TensorBoardOptions& options);
  /// After each iteration (writes on multiples of the TensorBoard interval).
  void iteration(int64_t iteration, int64_t consumed_samples, double lm_loss, double lr, double grad_norm,
                 int64_t batch_size);
  /// At each --log-interval line: the interval's mean iteration time, TFLOP/s per GPU, peak bytes.
  void interval(int64_t iteration, double seconds_per_iteration, double tflops_per_gpu, double peak_memory_bytes);
  /// After a validation pass; `what` is "validation" or "test".
  void validation(const std::string& what, int64_t iteration, int64_t consumed_samples, double loss);
  const std::string& path() const { return writer_.path(); }

 private:
  TensorBoardOptions options_;
  TensorBoardWriter writer_;
};

}  // namespace megadlm::training
