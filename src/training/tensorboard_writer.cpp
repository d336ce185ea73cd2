// TensorBoard event files (include/megadlm/training/tensorboard_writer.h). The protobuf messages
// are encoded by hand: Event{wall_time = 1 (double), step = 2 (varint), file_version = 3
// (string), summary = 5}, Summary{value = 1 (repeated)}, Summary.Value{tag = 1 (string),
// simple_value = 2 (float)}; tag byte = field << 3 | wire type (0 varint, 1 64-bit,
// 2 length-delimited, 5 32-bit). Little-endian throughout.
#include "megadlm/training/tensorboard_writer.h"
#include <unistd.h>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include "megadlm/core/error.h"

namespace megadlm::training {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the host is little-endian (x86-64, aarch64)
  out.append(b, sizeof(T));
}

void put_bytes(std::string& out, uint8_t tag, const std::string& bytes) {
  out.push_back(static_cast<char>(tag));
  put_varint(out, bytes.size());
  out += bytes;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  e.push_back(0x09);  // wall_time
  put_fixed(e, wall_time);
  if (step != 0) {    // proto3 omits zero-valued fields
    e.push_back(0x10);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) MDLM_FAIL("--tensorboard-dir ", dir, ": cannot create the directory (", ec.message(), ")");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  static std::atomic<int> counter{0};
  const long long secs = static_cast<long long>(std::floor(now_seconds()));
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d", secs, host, static_cast<int>(getpid()),
                counter++);
  path_ = (std::filesystem::path(dir) / name).string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) MDLM_FAIL("--tensorboard-dir ", dir, ": cannot create ", path_, " (", std::strerror(errno), ")");
  std::string e = event_header(now_seconds(), 0);
  put_bytes(e, 0x1A, "brain.Event:2");  // file_version
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string r;
  const uint64_t len = event.size();
  put_fixed(r, len);
  put_fixed(r, masked_crc32c(r.data(), 8));
  r += event;
  put_fixed(r, masked_crc32c(event.data(), event.size()));
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size()) write_failed();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, 0x0A, tag);
  v.push_back(0x15);  // simple_value
  put_fixed(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 0x0A, v);
  std::string e = event_header(now_seconds(), step);
  put_bytes(e, 0x2A, summary);
  write_record(e);
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) write_failed();
}

void TensorBoardWriter::write_failed() const {
  MDLM_FAIL("--tensorboard-dir: writing the event file ", path_, " failed (", std::strerror(errno),
            "). The run stops rather than lose its TensorBoard record silently: free space, then resume "
            "from the last checkpoint; or run without --tensorboard-dir");
}

TrainingTensorBoard::TrainingTensorBoard(const TensorBoardOptions& options)
    : options_(options), writer_(options.dir) {}

void TrainingTensorBoard::iteration(int64_t it, int64_t samples, double lm_loss, double lr, double grad_norm,
                                    int64_t batch_size) {
  if (options_.log_interval <= 0 || it % options_.log_interval != 0) return;
  auto both = [&](const std::string& tag, double v) {
    writer_.add_scalar(tag, v, it);
    writer_.add_scalar(tag + " vs samples", v, samples);
  };
  both("learning-rate", lr);
  both("batch-size", static_cast<double>(batch_size));
  both("lm loss", lm_loss);
  both("grad-norm", grad_norm);
  both("loss-scale", 1.0);
  writer_.flush();
}

void TrainingTensorBoard::interval(int64_t it, double seconds_per_iteration, double tflops_per_gpu,
                                   double peak_memory_bytes) {
  if (options_.log_timers) writer_.add_scalar("iteration-time", seconds_per_iteration, it);
  if (options_.log_timers && options_.log_throughput) writer_.add_scalar("throughput", tflops_per_gpu, it);
  if (options_.log_memory) writer_.add_scalar("mem-max-allocated-bytes", peak_memory_bytes, it);
  writer_.flush();
}

void TrainingTensorBoard::validation(const std::string& what, int64_t it, int64_t samples, double loss) {
  const std::string tag = "lm loss " + what;
  writer_.add_scalar(tag, loss, it);
  writer_.add_scalar(tag + " vs samples", loss, samples);
  if (options_.log_validation_ppl) {
    const double ppl = std::exp(std::min(20.0, loss));
    writer_.add_scalar(tag + " ppl", ppl, it);
    writer_.add_scalar(tag + " ppl vs samples", ppl, samples);
  }
  writer_.flush();
}

}  // namespace megadlm::training
