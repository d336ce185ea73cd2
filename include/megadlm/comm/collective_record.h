// The last collectives a communicator issued, so that a hang can be diagnosed after the fact
// (docs/launching.md, "The last collectives, on file"): each communicator keeps a ring of its
// last N operations — op,
// element count, dtype, sequence number, when it was queued and when it was seen complete. On a
// communication timeout or an abort, every rank that gets there writes the records of all its
// groups to one file (DistributedRuntime::set_collective_log_dir; docs/launching.md), and the
// error names that file. Comparing the ranks' files shows who stopped where: the rank whose
// last sequence number is lower, or that waits in a different operation, is the culprit.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include "megadlm/core/dtype.h"

namespace megadlm::comm {

struct CollectiveEntry {
  uint64_t seq = 0;             ///< the communicator's sequence number (also in error messages)
  const char* op = "";          ///< "all_reduce", "batch_p2p", ... (static strings)
  int64_t count = 0;            ///< elements moved by this rank (sum over a batch's transfers)
  std::optional<DType> dtype;   ///< none for barrier / split
  std::string detail;           ///< "sum", "root 0", "3 transfer(s)", ...
  std::chrono::system_clock::time_point enqueued;
  std::optional<std::chrono::system_clock::time_point> completed;  ///< none: never seen done
};

/// "2025-06-01 10:12:44.123" (local wall clock, so that the files of several hosts line up).
std::string wall_clock_text(std::chrono::system_clock::time_point t);

/// A bounded ring of CollectiveEntry, safe to read while the owner writes (one mutex; the cost
/// is a lock and a small copy per operation, next to the message formatting each op already does).
class CollectiveRecord {
 public:
  static constexpr size_t kDefaultCapacity = 256;
  explicit CollectiveRecord(size_t capacity = kDefaultCapacity);

  /// A new operation, queued now.
  void begin(uint64_t seq, const char* op, int64_t count, std::optional<DType> dtype, std::string detail);
  /// The operation `seq` finished (no-op when it has left the ring).
  void complete(uint64_t seq);
  /// The kept entries, oldest first.
  std::vector<CollectiveEntry> entries() const;
  /// Operations issued in total (the ring keeps the last `capacity`).
  uint64_t issued() const;

  /// The block one group contributes to the file: a header line naming `group`, then one line
  /// per entry (incomplete ones say how long they have waited at `now`).
  std::string format(const std::string& group, std::chrono::system_clock::time_point now) const;

 private:
  mutable std::mutex mu_;
  std::vector<CollectiveEntry> ring_;
  size_t capacity_;
  size_t next_ = 0;  ///< slot of the next entry
  uint64_t issued_ = 0;
};

}  // namespace megadlm::comm
