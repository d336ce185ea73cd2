// Shared helpers of the multi-rank checkpoint suites (support/checkpoint_checks.h).
#include "support/checkpoint_checks.h"
#include <gtest/gtest.h>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "support/spmd.h"

namespace megadlm::test {

std::string broadcast_string(comm::Communicator& world, const std::string& s) {
  Tensor t = Tensor::zeros({512}, DType::I32, Stream::cpu());
  if (world.rank() == 0) {
    MDLM_CHECK(s.size() < 512, "broadcast_string: ", s.size(), " characters (at most 511)");
    for (size_t i = 0; i < s.size(); ++i) t.data<int32_t>()[i] = s[i];
  }
  world.broadcast(t, 0, Stream::cpu());
  std::string out;
  for (int i = 0; i < 512 && t.data<int32_t>()[i] != 0; ++i) out += static_cast<char>(t.data<int32_t>()[i]);
  return out;
}

SharedTempDir::SharedTempDir(comm::Communicator& world, const std::string& prefix) : world_(world) {
  if (world.rank() == 0) owned_ = std::make_unique<TempDir>(prefix);
  path_ = broadcast_string(world, owned_ ? owned_->str() : std::string());
}

SharedTempDir::~SharedTempDir() { world_.barrier(Stream::cpu()); }  // owned_ goes after every rank arrived

std::string SharedTempDir::operator/(const std::string& sub) const {
  return (std::filesystem::path(path_) / sub).string();
}

std::unique_ptr<Trainer> quiet_trainer(const RunConfig& cfg, const parallel::ProcessGroups* groups,
                                       int64_t vocab, int64_t seq) {
  static std::ostringstream log;  // rank 0's log lines are not looked at here
  return std::make_unique<Trainer>(cfg, std::make_shared<MockGptDataset>(vocab, seq, vocab - 1), log, groups);
}

void expect_same_tensors(const std::string& a_dir, const std::string& b_dir, const std::string& what) {
  const std::string at = what.empty() ? "" : what + ": ";
  checkpoint::CheckpointReader a(*checkpoint::find_checkpoint(a_dir, std::nullopt));
  checkpoint::CheckpointReader b(*checkpoint::find_checkpoint(b_dir, std::nullopt));
  ASSERT_EQ(a.index().tensors.size(), b.index().tensors.size()) << what;
  EXPECT_EQ(a.index().state.iteration, b.index().state.iteration) << what;
  EXPECT_EQ(a.index().state.consumed_samples, b.index().state.consumed_samples) << what;
  EXPECT_EQ(a.index().state.optimizer_steps, b.index().state.optimizer_steps) << what;
  for (const auto& [name, info] : a.index().tensors) {
    ASSERT_TRUE(b.has_tensor(name)) << at << name;
    const Tensor x = a.read_whole(name), y = b.read_whole(name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << at << name;
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << at << "tensor " << name << " differs";
  }
}

void expect_identical_resume(const std::vector<IterationMetrics>& resumed,
                             const std::vector<IterationMetrics>& straight, int64_t stop,
                             const std::string& what) {
  ASSERT_EQ(resumed.size() + static_cast<size_t>(stop), straight.size()) << what;
  for (size_t i = 0; i < resumed.size(); ++i) {
    const IterationMetrics& want = straight[static_cast<size_t>(stop) + i];
    EXPECT_EQ(resumed[i].iteration, want.iteration) << what;
    EXPECT_EQ(resumed[i].lm_loss, want.lm_loss) << what << ", iteration " << want.iteration;
    EXPECT_EQ(resumed[i].grad_norm, want.grad_norm) << what << ", iteration " << want.iteration;
  }
}

void expect_close_resume(const std::vector<IterationMetrics>& resumed,
                         const std::vector<IterationMetrics>& straight, int64_t stop, const std::string& what) {
  const int rank = spmd::launch_rank();
  ASSERT_EQ(resumed.size() + static_cast<size_t>(stop), straight.size()) << what;
  for (size_t i = 0; i < resumed.size(); ++i) {
    const IterationMetrics& r = straight[static_cast<size_t>(stop) + i];
    EXPECT_EQ(resumed[i].iteration, r.iteration) << what;
    EXPECT_NEAR(resumed[i].lm_loss, r.lm_loss, 1e-5 * r.lm_loss)
        << what << ", rank " << rank << ", iteration " << r.iteration;
    EXPECT_NEAR(resumed[i].grad_norm, r.grad_norm, 1e-5 * r.grad_norm)
        << what << ", rank " << rank << ", iteration " << r.iteration;
  }
}

}  // namespace megadlm::test
