// What the multi-rank checkpoint suites share (tests/layout/checkpoint, tests/layout/
// context_parallel): a scratch directory every rank sees, a quiet trainer on the mock data, and
// the three checks of a checkpoint across layouts: every tensor of a re-saved checkpoint is the
// original bit for bit, a resume under the same layout repeats the uninterrupted run exactly,
// and a resume under another layout follows it to 1e-5 (relative: layouts differ in fp32
// reduction order only).
//
// Test code only (linked into every SPMD suite through megadlm_spmd_support).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "megadlm/comm/communicator.h"
#include "megadlm/parallel/process_groups.h"
#include "megadlm/training/trainer.h"
#include "support/scratch.h"

namespace megadlm::test {

/// Rank 0's `s` on every rank of `world` (at most 511 characters); every rank must call it.
std::string broadcast_string(comm::Communicator& world, const std::string& s);

/// A fresh directory /tmp/<prefix>XXXXXX made by rank 0 and named to every rank (one machine);
/// removed after every rank has reached the end of its scope. Collective in both.
class SharedTempDir {
 public:
  SharedTempDir(comm::Communicator& world, const std::string& prefix);
  ~SharedTempDir();
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  std::string operator/(const std::string& sub) const;

 private:
  comm::Communicator& world_;
  std::unique_ptr<TempDir> owned_;  // rank 0 only
  std::string path_;
};

/// A Trainer for cfg on MockGptDataset(vocab, seq, mask token vocab - 1), logging to a stream
/// nobody reads; groups null: this process alone.
std::unique_ptr<Trainer> quiet_trainer(const RunConfig& cfg, const parallel::ProcessGroups* groups,
                                       int64_t vocab = 128, int64_t seq = 32);

/// Every tensor of the latest checkpoints in a_dir and b_dir, bit for bit, and their training
/// state (iteration, consumed samples, optimizer steps). `what` prefixes the failures.
void expect_same_tensors(const std::string& a_dir, const std::string& b_dir, const std::string& what = "");

/// A run resumed at iteration index `stop` of `straight`: the remaining iterations, each with
/// the straight run's loss and gradient norm exactly.
void expect_identical_resume(const std::vector<IterationMetrics>& resumed,
                             const std::vector<IterationMetrics>& straight, int64_t stop,
                             const std::string& what);

/// The same under another layout: loss and gradient norm to 1e-5 relative.
void expect_close_resume(const std::vector<IterationMetrics>& resumed,
                         const std::vector<IterationMetrics>& straight, int64_t stop, const std::string& what);

}  // namespace megadlm::test
