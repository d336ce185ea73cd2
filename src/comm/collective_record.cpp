// comm/collective_record.h: the ring, and the text one group's block has in the file.
#include "megadlm/comm/collective_record.h"
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace megadlm::comm {

namespace {

long long ms_between(std::chrono::system_clock::time_point a, std::chrono::system_clock::time_point b) {
  return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
}

}  // namespace

// "2025-06-01 10:12:44.123": wall clock, so that the files of several hosts line up.
std::string wall_clock_text(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[48];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  char out[64];
  std::snprintf(out, sizeof out, "%s.%03d", buf, static_cast<int>(ms));
  return out;
}

CollectiveRecord::CollectiveRecord(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {
  ring_.reserve(capacity_);
}

void CollectiveRecord::begin(uint64_t seq, const char* op, int64_t count, std::optional<DType> dtype,
                             std::string detail) {
  CollectiveEntry e;
  e.seq = seq;
  e.op = op;
  e.count = count;
  e.dtype = dtype;
  e.detail = std::move(detail);
  e.enqueued = std::chrono::system_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() < capacity_) ring_.push_back(std::move(e));
  else ring_[next_] = std::move(e);
  next_ = (next_ + 1) % capacity_;
  ++issued_;
}

void CollectiveRecord::complete(uint64_t seq) {
  const auto now = std::chrono::system_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  // The newest entries are the likely ones: search backwards from the last written slot.
  for (size_t k = 0; k < ring_.size(); ++k) {
    CollectiveEntry& e = ring_[(next_ + ring_.size() - 1 - k) % ring_.size()];
    if (e.seq == seq) {
      if (!e.completed) e.completed = now;
      return;
    }
  }
}

std::vector<CollectiveEntry> CollectiveRecord::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveEntry> out;
  out.reserve(ring_.size());
  const size_t start = ring_.size() < capacity_ ? 0 : next_;
  for (size_t k = 0; k < ring_.size(); ++k) out.push_back(ring_[(start + k) % ring_.size()]);
  return out;
}

uint64_t CollectiveRecord::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_;
}

std::string CollectiveRecord::format(const std::string& group, std::chrono::system_clock::time_point now) const {
  const std::vector<CollectiveEntry> kept = entries();
  std::ostringstream os;
  os << group << ": " << issued() << " operation(s) issued, the last " << kept.size() << " below\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-8s %-14s %12s %-5s %-23s %s\n", "seq", "op", "count", "dtype",
                "enqueued", "completed");
  os << line;
  for (const CollectiveEntry& e : kept) {
    const std::string done = e.completed ? "after " + std::to_string(ms_between(e.enqueued, *e.completed)) + " ms"
                                         : "NOT COMPLETED (waiting " + std::to_string(ms_between(e.enqueued, now)) + " ms)";
    std::snprintf(line, sizeof line, "  #%-7llu %-14s %12lld %-5s %-23s %s%s%s\n",
                  static_cast<unsigned long long>(e.seq), e.op, static_cast<long long>(e.count),
                  e.dtype ? dtype_name(*e.dtype) : "-", wall_clock_text(e.enqueued).c_str(), done.c_str(),
                  e.detail.empty() ? "" : "  ", e.detail.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace megadlm::comm
