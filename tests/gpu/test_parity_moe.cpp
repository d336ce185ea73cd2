// MoE kernel parity: the CUDA router (top-k for every score mode and group limit, its backward,
// statistics, aux/z gradients), dispatch plan, permute/unpermute (+ backward) and grouped GEMM
// against the CPU reference on the same (bf16-rounded where the CUDA op reads bf16) inputs,
// including experts without tokens and one expert holding every token; the benchmark routing's
// random logits; and a whole MoE training step CUDA vs CPU.
#include <gtest/gtest.h>
#include <cmath>
#include <numeric>
#include <sstream>
#include "megadlm/data/mock_dataset.h"
#include "megadlm/ops/moe.h"
#include "megadlm/training/trainer.h"
#include "parity.h"
#include "support/tiny_model.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

constexpr int64_t kRows = 1000, kExperts = 64;

std::vector<int32_t> ints_of(const Tensor& t, const Stream& s) { return t.to_ints(s); }

/// Random logits spread over [-4, 4), rounded to bf16 (what a bf16 GEMM with f32 output
/// cannot produce exactly, but it keeps equal values equal on both sides).
Input logits_input(const Stream& gpu) { return make_input({kRows, kExperts}, DType::F32, gpu, -4.0f, 4.0f); }

void topk_case(const char* name, ops::RouterTopkArgs a, bool bias) {
  Stream gpu = gpu_stream();
  Input logits = logits_input(gpu);
  Input b = make_input({kExperts}, DType::F32, gpu, -0.5f, 0.5f);
  const Tensor none;
  Tensor p_dev = poisoned({kRows, a.topk}, DType::F32, gpu);
  Tensor i_dev = Tensor::empty({kRows, a.topk}, DType::I32, gpu);
  Tensor p_host = poisoned_host({kRows, a.topk});
  Tensor i_host = Tensor::empty({kRows, a.topk}, DType::I32, Stream::cpu());
  ops::moe_router_topk_forward(logits.device, bias ? b.device : none, p_dev, i_dev, a, gpu);
  ops::moe_router_topk_forward(logits.host, bias ? b.host : none, p_host, i_host, a, Stream::cpu());
  const std::vector<int32_t> id = ints_of(i_dev, gpu), ih = ints_of(i_host, Stream::cpu());
  size_t differ = 0;
  for (size_t i = 0; i < id.size(); ++i) differ += id[i] != ih[i];
  std::printf("[parity] moe top-k %-45s %zu of %zu selections differ\n", name, differ, id.size());
  EXPECT_EQ(differ, 0u) << name;
  expect_close(std::string("moe top-k probs ") + name, download(p_dev, gpu), test::to_doubles(p_host),
               test::kF32ElementwiseRelL2 * 10);
  // Backward through the same selection.
  Input dp = make_input({kRows, a.topk}, DType::F32, gpu);
  Tensor dl_dev = poisoned({kRows, kExperts}, DType::F32, gpu), dl_host = poisoned_host({kRows, kExperts});
  ops::moe_router_topk_backward(dp.device, logits.device, i_dev, dl_dev, a, gpu);
  ops::moe_router_topk_backward(dp.host, logits.host, i_host, dl_host, a, Stream::cpu());
  expect_close(std::string("moe top-k backward ") + name, download(dl_dev, gpu), test::to_doubles(dl_host),
               test::kF32ElementwiseRelL2 * 10);
}

}  // namespace

TEST(MoeParity, RouterTopkMatchesCpuForEveryScoreFunction) {
  MDLM_REQUIRE_GPU();
  topk_case("post-softmax k=8", {.topk = 8}, false);
  topk_case("pre-softmax k=2 scaled", {.topk = 2, .pre_softmax = true, .scaling = 2.5f}, false);
  topk_case("pre-softmax k=1", {.topk = 1, .pre_softmax = true}, false);
  topk_case("sigmoid k=8 + expert bias", {.topk = 8, .score = ops::RouterScore::Sigmoid}, true);
  topk_case("sigmoid k=1", {.topk = 1, .score = ops::RouterScore::Sigmoid}, false);
  topk_case("group-limited 8 groups keep 3", {.topk = 6, .num_groups = 8, .group_topk = 3}, false);
  topk_case("device-limited 4 groups keep 2",
            {.topk = 4, .num_groups = 4, .group_topk = 2, .group_score = ops::RouterGroupScore::Max}, false);
}

TEST(MoeParity, RandomLogitsMatchCpu) {
  MDLM_REQUIRE_GPU();
  // Same coordinates (an SP row offset, a CP chunk map) on both sides: the same normal values,
  // up to the device's double-precision log/cos against the host's, then the f32 rounding.
  Stream gpu = gpu_stream();
  const ops::RandomLogitsArgs a{.seed = 11, .layer = 5, .seq_len = 50, .sample_offset = 9, .row_offset = 30,
                                .chunks = ops::ChunkMap{25, 1, 2}};
  Tensor dev = poisoned({kRows, kExperts}, DType::F32, gpu);
  Tensor host = poisoned_host({kRows, kExperts});
  ops::moe_random_logits(dev, a, gpu);
  ops::moe_random_logits(host, a, Stream::cpu());
  expect_close("moe random logits", download(dev, gpu), test::to_doubles(host), 1e-6);
}

TEST(MoeParity, RouterStatisticsAndLossGradientsMatchCpu) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  Input logits = logits_input(gpu);
  const ops::RowGroups groups{.rows_per_group = 250, .row_offset = 0};
  Tensor s_dev = Tensor::zeros({4, kExperts}, DType::F32, gpu), z_dev = Tensor::zeros({1}, DType::F32, gpu);
  Tensor s_host = Tensor::zeros({4, kExperts}, DType::F32, Stream::cpu()), z_host = Tensor::zeros({1}, DType::F32, Stream::cpu());
  ops::moe_router_stats(logits.device, s_dev, z_dev, groups, gpu);
  ops::moe_router_stats(logits.host, s_host, z_host, groups, Stream::cpu());
  expect_close("moe router score sums (4 groups)", download(s_dev, gpu), test::to_doubles(s_host), test::kF32AccumRelL2);
  expect_close("moe router logsumexp^2", download(z_dev, gpu), test::to_doubles(z_host), test::kF32AccumRelL2);

  Input w = make_input({4, kExperts}, DType::F32, gpu, 0.0f, 50.0f);
  Input dl0 = make_input({kRows, kExperts}, DType::F32, gpu);
  Tensor dl_dev = dl0.device, dl_host = dl0.host;  // accumulated into
  const ops::RouterLossArgs la{.aux_coeff = 0.3f, .z_coeff = 0.01f, .groups = groups};
  ops::moe_router_loss_backward(logits.device, w.device, dl_dev, la, gpu);
  ops::moe_router_loss_backward(logits.host, w.host, dl_host, la, Stream::cpu());
  expect_close("moe router aux + z gradient (added)", download(dl_dev, gpu), test::to_doubles(dl_host),
               test::kF32ElementwiseRelL2 * 10);

  // Counts are exact.
  Tensor idx_host = Tensor::empty({kRows, 8}, DType::I32, Stream::cpu());
  Tensor p_host = Tensor::empty({kRows, 8}, DType::F32, Stream::cpu());
  ops::moe_router_topk_forward(logits.host, Tensor(), p_host, idx_host, {.topk = 8}, Stream::cpu());
  Tensor idx_dev = idx_host.to(gpu.device(), gpu);
  Tensor c_dev = Tensor::zeros({4, kExperts}, DType::F32, gpu), c_host = Tensor::zeros({4, kExperts}, DType::F32, Stream::cpu());
  ops::moe_count_tokens(idx_dev, c_dev, groups, gpu);
  ops::moe_count_tokens(idx_host, c_host, groups, Stream::cpu());
  EXPECT_EQ(download(c_dev, gpu), test::to_doubles(c_host));
}

TEST(MoeParity, DispatchPlanPermuteAndUnpermuteMatchCpu) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  const int64_t k = 8;
  // Routings: random top-8; every slot on experts 0..7 (one expert per slot, the others get
  // nothing); and a local range [16, 48) with -1 (dropped) slots mixed in. Hidden sizes: 384
  // (16-byte vectors, part of one unrolled round of the permute gather), 4104 (several rounds
  // and a partial one, several column passes of unpermute's block) and 37 (single elements).
  Input logits = logits_input(gpu);
  Tensor idx_random = Tensor::empty({kRows, k}, DType::I32, Stream::cpu());
  Tensor probs_host = Tensor::empty({kRows, k}, DType::F32, Stream::cpu());
  ops::moe_router_topk_forward(logits.host, Tensor(), probs_host, idx_random, {.topk = 8}, Stream::cpu());
  std::vector<int32_t> crowded(static_cast<size_t>(kRows * k)), dropped = idx_random.to_ints(Stream::cpu());
  for (int64_t i = 0; i < kRows * k; ++i) crowded[static_cast<size_t>(i)] = static_cast<int32_t>(i % k);
  for (size_t i = 0; i < dropped.size(); i += 5) dropped[i] = -1;
  struct Case {
    const char* name;
    Tensor indices;
    int first, count;
  };
  const Case cases[] = {{"random top-8", idx_random, 0, static_cast<int>(kExperts)},
                        {"8 experts take every token", Tensor::from_ints(crowded, {kRows, k}), 0, static_cast<int>(kExperts)},
                        {"local experts 16..47 with dropped slots", Tensor::from_ints(dropped, {kRows, k}), 16, 32}};
  Tensor probs_dev = probs_host.to(gpu.device(), gpu);
  for (const int64_t h : {int64_t{384}, int64_t{4104}, int64_t{37}})
  for (const Case& c : cases) {
    Input x = make_input({kRows, h}, DType::BF16, gpu);
    const std::string name = detail::concat(c.name, " h=", h);
    Tensor idx_dev = c.indices.to(gpu.device(), gpu);
    Tensor dest_dev = Tensor::empty({kRows, k}, DType::I32, gpu), cnt_dev = Tensor::empty({c.count}, DType::I32, gpu);
    Tensor dest_host = Tensor::empty({kRows, k}, DType::I32, Stream::cpu());
    Tensor cnt_host = Tensor::empty({c.count}, DType::I32, Stream::cpu());
    ops::moe_dispatch_plan(idx_dev, c.first, c.count, dest_dev, cnt_dev, gpu);
    ops::moe_dispatch_plan(c.indices, c.first, c.count, dest_host, cnt_host, Stream::cpu());
    EXPECT_EQ(ints_of(cnt_dev, gpu), ints_of(cnt_host, Stream::cpu())) << name;
    EXPECT_EQ(ints_of(dest_dev, gpu), ints_of(dest_host, Stream::cpu())) << name;
    const std::vector<int32_t> cnt = ints_of(cnt_host, Stream::cpu());
    const int64_t n = std::accumulate(cnt.begin(), cnt.end(), int64_t{0});
    Tensor xp_dev = poisoned({n, h}, DType::BF16, gpu), xp_host = poisoned_host({n, h});
    ops::moe_permute(x.device, dest_dev, xp_dev, gpu);
    ops::moe_permute(x.host, dest_host, xp_host, Stream::cpu());
    EXPECT_EQ(download(xp_dev, gpu), test::to_doubles(xp_host)) << name << ": permute moves bits";
    Input y = make_input({n, h}, DType::BF16, gpu);
    Tensor out_dev = poisoned({kRows, h}, DType::BF16, gpu), out_host = poisoned_host({kRows, h});
    ops::moe_unpermute(y.device, dest_dev, probs_dev, out_dev, gpu);
    ops::moe_unpermute(y.host, dest_host, probs_host, out_host, Stream::cpu());
    expect_close("moe unpermute " + name, download(out_dev, gpu), test::to_doubles(out_host),
                 test::kBf16ParityRelL2);
    Input dout = make_input({kRows, h}, DType::BF16, gpu);
    Tensor dy_dev = poisoned({n, h}, DType::BF16, gpu), dy_host = poisoned_host({n, h});
    Tensor dp_dev = poisoned({kRows, k}, DType::F32, gpu), dp_host = poisoned_host({kRows, k});
    ops::moe_unpermute_backward(dout.device, y.device, dest_dev, probs_dev, dy_dev, dp_dev, gpu);
    ops::moe_unpermute_backward(dout.host, y.host, dest_host, probs_host, dy_host, dp_host, Stream::cpu());
    expect_close("moe unpermute backward dy " + name, download(dy_dev, gpu),
                 test::to_doubles(dy_host), test::kBf16ParityRelL2);
    expect_close("moe unpermute backward dprobs " + name, download(dp_dev, gpu),
                 test::to_doubles(dp_host), test::kF32AccumRelL2);
  }
}

TEST(MoeParity, GroupedGemmMatchesCpuWithEmptyAndFullGroups) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  const int64_t k = 256, n = 384;
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{100, 0, 357, 1, 0, 64, 200, 78}, std::vector<int64_t>{0, 0, 800, 0},
        std::vector<int64_t>{0, 0, 0}}) {
    const int64_t groups = static_cast<int64_t>(rows.size());
    const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
    Input a = make_input({std::max<int64_t>(total, 0), k}, DType::BF16, gpu);
    Input w = make_input({groups * n, k}, DType::BF16, gpu);
    const std::string tag = detail::concat(groups, " groups, ", total, " rows");
    if (total > 0) {
      Tensor c_dev = poisoned({total, n}, DType::BF16, gpu), c_host = poisoned_host({total, n});
      ops::grouped_gemm(a.device, w.device, c_dev, rows, {.trans_b = true}, gpu);
      ops::grouped_gemm(a.host, w.host, c_host, rows, {.trans_b = true}, Stream::cpu());
      expect_close("grouped gemm fwd " + tag, download(c_dev, gpu), test::to_doubles(c_host), test::kBf16ParityRelL2);
    }
    // Weight gradients accumulated into f32 (empty groups keep their values).
    Input dy = make_input({total, n}, DType::BF16, gpu);
    Input g0 = make_input({groups * n, k}, DType::F32, gpu);
    Tensor g_dev = g0.device, g_host = g0.host;
    ops::grouped_gemm(dy.device, a.device, g_dev, rows, {.trans_a = true, .beta = 1.0f}, gpu);
    ops::grouped_gemm(dy.host, a.host, g_host, rows, {.trans_a = true, .beta = 1.0f}, Stream::cpu());
    expect_close("grouped gemm wgrad (+=) " + tag, download(g_dev, gpu), test::to_doubles(g_host), test::kF32AccumRelL2);
  }
}

TEST(MoeParity, MoeTrainingStepOnCudaMatchesCpu) {
  MDLM_REQUIRE_GPU();
  auto run = [](DeviceKind device) {
    RunConfig r = test::tiny_run({.layers = 2, .hidden = 256, .heads = 4, .query_groups = 2, .kv_channels = 64,
                                  .ffn = 512, .seq = 128, .vocab = 512}, 5);
    test::make_moe(r, 16, 4);
    r.model.moe.grouped_gemm = true;
    r.model.moe.shared_expert_size = 128;
    r.optimizer.lr = 1e-3f;
    r.training.global_batch_size = 4;
    r.training.device = device;
    r.training.bf16 = device == DeviceKind::Cuda;
    return r;
  };
  auto data = std::make_shared<MockGptDataset>(512, 128, 511);
  std::ostringstream log;
  Trainer cpu(run(DeviceKind::Cpu), data, log);
  Trainer gpu(run(DeviceKind::Cuda), data, log);
  for (int i = 0; i < 5; ++i) {
    const IterationMetrics a = cpu.step(), b = gpu.step();
    const double dl = std::fabs(a.lm_loss - b.lm_loss) / a.lm_loss;
    const double dg = std::fabs(a.grad_norm - b.grad_norm) / a.grad_norm;
    const double da = std::fabs(a.moe.aux_loss - b.moe.aux_loss) / a.moe.aux_loss;
    std::printf("[parity moe] iteration %d: loss cpu %.6f cuda %.6f (rel %.2e), grad norm rel %.2e, "
                "aux cpu %.5f cuda %.5f (rel %.2e), load cpu %.3f cuda %.3f\n",
                i + 1, a.lm_loss, b.lm_loss, dl, dg, a.moe.aux_loss, b.moe.aux_loss, da,
                a.moe.load_max_over_mean, b.moe.load_max_over_mean);
    // The dense model's whole step (TrainingParity), measured on H200: loss within 3.0e-4,
    // grad norm within 9.2e-3. This MoE step has no H200 measurement yet (the line above prints
    // it): the bf16 router input can route a few tokens to other experts than fp32 does, so the
    // loss gets 3e-3 (10x the dense loss) and the gradient norm and aux loss 4e-2 (~4x the dense
    // grad norm) — to be replaced by 10x the measured values.
    EXPECT_LT(dl, 3e-3) << "iteration " << i + 1;
    EXPECT_LT(dg, 4e-2) << "iteration " << i + 1;
    EXPECT_LT(da, 4e-2) << "iteration " << i + 1;
  }
}
