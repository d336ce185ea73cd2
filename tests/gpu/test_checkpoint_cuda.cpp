// Checkpoints on the CUDA backend (bf16 model, fp32 masters). Runs on the device machine:
//   * loading restores every tensor bit for bit (saved again at once and compared) and the bf16
//     model weights equal the original run's (masters rounded exactly as the optimizer step does);
//   * the steps after a resume match the uninterrupted run: bitwise when two uninterrupted runs
//     are themselves bitwise identical (deterministic kernels), else to 1e-3 relative (the
//     run-to-run spread of non-deterministic reductions) — the test records which;
//   * a CUDA checkpoint loads in a CPU run (fp32 masters are layout- and device-independent).
#include <gtest/gtest.h>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/training/checkpoint/checkpoint.h"
#include "megadlm/training/trainer.h"
#include "support/op_testing.h"
#include "support/scratch.h"
#include "support/tiny_model.h"

using namespace megadlm;
using test::TempDir;
namespace fs = std::filesystem;

namespace {

RunConfig run(DeviceKind device, int64_t iters) {
  RunConfig r = test::tiny_run({.hidden = 256, .kv_channels = 64, .ffn = 512, .seq = 128, .vocab = 512}, iters);
  r.model.vocab_size = 500;  // padded to 512
  r.model.hidden_dropout = 0.1f;
  r.diffusion.mask_token = 499;
  r.optimizer.lr = 1e-3f;
  r.optimizer.lr_warmup_iters = 1;
  r.optimizer.weight_decay = 0.01f;  // Megatron's defaults
  r.optimizer.clip_grad = 1.0f;
  r.training.global_batch_size = 4;
  r.training.bf16 = device == DeviceKind::Cuda;
  r.training.device = device;
  return r;
}

std::unique_ptr<Trainer> trainer(const RunConfig& cfg) {
  static std::ostringstream log;
  return std::make_unique<Trainer>(cfg, std::make_shared<MockGptDataset>(500, 128, 499), log);
}

/// The bytes of a tensor of the trainer's device (a CUDA tensor copies out on the trainer's stream).
std::vector<uint8_t> bytes_of(const Tensor& t, const Stream& stream) {
  const Tensor h = t.to(Device::cpu(), stream);
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

void expect_same_checkpoints(const std::string& a_dir, const std::string& b_dir) {
  checkpoint::CheckpointReader a(*checkpoint::find_checkpoint(a_dir, std::nullopt));
  checkpoint::CheckpointReader b(*checkpoint::find_checkpoint(b_dir, std::nullopt));
  ASSERT_EQ(a.index().tensors.size(), b.index().tensors.size());
  for (const auto& [name, t] : a.index().tensors) {
    const Tensor x = a.read_whole(name), y = b.read_whole(name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << name;
  }
}

}  // namespace

TEST(CheckpointCuda, LoadingRestoresEveryTensorAndTheBf16Weights) {
  MDLM_REQUIRE_GPU();
  TempDir dir;
  RunConfig first = run(DeviceKind::Cuda, 6);
  first.checkpoint.save = dir / "a";
  first.training.exit_interval = 3;
  auto original = trainer(first);
  original->train();
  RunConfig second = run(DeviceKind::Cuda, 6);
  second.checkpoint.load = dir / "a";
  second.checkpoint.save = dir / "b";
  auto loaded = trainer(second);
  EXPECT_EQ(bytes_of(loaded->parameters().flat_params(), loaded->runtime().stream),
            bytes_of(original->parameters().flat_params(), original->runtime().stream))
      << "bf16 model weights after loading differ from the run that saved them";
  loaded->save_checkpoint();
  expect_same_checkpoints(dir / "a", dir / "b");
}

TEST(CheckpointCuda, ResumedStepsMatchTheUninterruptedRun) {
  MDLM_REQUIRE_GPU();
  TempDir dir;
  const auto straight = trainer(run(DeviceKind::Cuda, 6))->train();
  const auto again = trainer(run(DeviceKind::Cuda, 6))->train();
  bool deterministic = true;
  for (size_t i = 0; i < straight.size(); ++i)
    deterministic = deterministic && straight[i].lm_loss == again[i].lm_loss && straight[i].grad_norm == again[i].grad_norm;
  RecordProperty("cuda_training_bitwise_deterministic", deterministic ? "yes" : "no");
  RunConfig first = run(DeviceKind::Cuda, 6);
  first.checkpoint.save = dir / "a";
  first.training.exit_interval = 3;
  trainer(first)->train();
  RunConfig second = run(DeviceKind::Cuda, 6);
  second.checkpoint.load = dir / "a";
  const auto resumed = trainer(second)->train();
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const IterationMetrics& s = straight[3 + i];
    if (deterministic) {
      EXPECT_EQ(resumed[i].lm_loss, s.lm_loss) << "iteration " << s.iteration;
      EXPECT_EQ(resumed[i].grad_norm, s.grad_norm) << "iteration " << s.iteration;
    } else {
      // Non-deterministic kernels (atomics) differ run to run; a resume must stay inside that spread.
      EXPECT_NEAR(resumed[i].lm_loss, s.lm_loss, 1e-3 * s.lm_loss) << "iteration " << s.iteration;
    }
    std::printf("  iteration %lld: straight loss %.9g grad norm %.9g, resumed loss %.9g grad norm %.9g\n",
                static_cast<long long>(s.iteration), s.lm_loss, s.grad_norm, resumed[i].lm_loss, resumed[i].grad_norm);
  }
}

TEST(CheckpointCuda, ACudaCheckpointLoadsInACpuRun) {
  MDLM_REQUIRE_GPU();
  TempDir dir;
  RunConfig first = run(DeviceKind::Cuda, 4);
  first.checkpoint.save = dir / "gpu";
  first.training.exit_interval = 2;
  trainer(first)->train();
  RunConfig cpu = run(DeviceKind::Cpu, 4);
  cpu.checkpoint.load = dir / "gpu";
  cpu.checkpoint.save = dir / "cpu";
  auto t = trainer(cpu);
  t->save_checkpoint();
  expect_same_checkpoints(dir / "gpu", dir / "cpu");
}
