// GPU parity of block diffusion under context parallelism (docs/parallelism/context_parallel.md,
// "Block diffusion"): a ring of 2 and of 4 shards on one GPU — each shard's rows are its
// positions' noisy copies, then their clean copies (chunk-mapped halves), and every key shard in
// the ring's order goes through cp::ring_step_forward / ring_step_backward, merged on the device
// — against the CPU f32 block diffusion attention of the whole doubled rows on the same
// bf16-rounded inputs: out, lse, and dq, dk, dv (the backward of each block with the merged out
// and lse, dK/dV summed over the query shards as the ring's travelling accumulator sums them).
// Two packings, both clean-half rules: documents on the block grid (every block inside a chunk:
// the own block on the flash block diffusion kernels at 2 shards, the other shards' clean keys
// on the flash separate-key-block path) and documents whose starts are off the grid (blocks
// straddle the chunks: the simple key-block kernels, every element on its global row). Every
// test skips without a GPU.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/parallel/context_parallel/ring_attention.h"
#include "megadlm/parallel/context_parallel/sequence_layout.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;
using megadlm::cp::Split;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {

/// [4, L] ranges of one row: documents of the lengths in `docs` (cycled, the last cut at L),
/// blocks of `block` from each document's start.
std::vector<int32_t> row_ranges(int64_t L, const std::vector<int>& docs, int block) {
  std::vector<int32_t> r(static_cast<size_t>(4 * L));
  size_t next = 0;
  for (int64_t start = 0; start < L;) {
    const int64_t end = std::min<int64_t>(L, start + docs[next++ % docs.size()]);
    for (int64_t p = start; p < end; ++p) {
      const int64_t bs = start + (p - start) / block * block;
      r[static_cast<size_t>(p)] = static_cast<int32_t>(start);
      r[static_cast<size_t>(L + p)] = static_cast<int32_t>(end);
      r[static_cast<size_t>(2 * L + p)] = static_cast<int32_t>(bs);
      r[static_cast<size_t>(3 * L + p)] = static_cast<int32_t>(std::min<int64_t>(bs + block, end));
    }
    start = end;
  }
  return r;
}

/// Rows of whole doubled rows ([B·2L] row indices) that shard `s` holds, in its local order.
std::vector<int64_t> shard_rows(const Split& s, int64_t batch) {
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t copy = 0; copy < 2; ++copy)
      for (int64_t i = 0; i < s.local_len(); ++i) rows.push_back(b * 2 * s.seq + copy * s.seq + s.global(i));
  return rows;
}

Tensor take(const Tensor& x, const std::vector<int64_t>& rows, int64_t width) {
  Tensor out = Tensor::zeros({static_cast<int64_t>(rows.size()), width}, DType::F32, Stream::cpu());
  for (size_t m = 0; m < rows.size(); ++m)
    std::copy_n(x.data<float>() + rows[m] * width, width, out.data<float>() + static_cast<int64_t>(m) * width);
  return out;
}

void put(std::vector<double>& dst, const std::vector<double>& src, const std::vector<int64_t>& rows,
         int64_t width, bool add) {
  for (size_t m = 0; m < rows.size(); ++m)
    for (int64_t e = 0; e < width; ++e) {
      double& d = dst[static_cast<size_t>(rows[m] * width + e)];
      const double x = src[m * static_cast<size_t>(width) + static_cast<size_t>(e)];
      d = add ? d + x : x;
    }
}

Tensor bf16_rounded(const Shape& shape, uint64_t seed, float lo, float hi) {
  return test::random_tensor(shape, seed, DType::BF16, lo, hi).to(Device::cpu(), DType::F32, Stream::cpu());
}

}  // namespace

TEST(ContextParallelParity, BlockDiffusionRingOnOneGpuEqualsWholeRows) {
  MDLM_REQUIRE_GPU();
  const Stream cuda = Stream::create(Device::cuda(0));
  const Device dev = Device::cuda(0);
  // L = 256 (chunks of 64 at 2 shards, 32 at 4), blocks of 16; row 0 packed documents, row 1
  // one document.
  const int64_t B = 2, L = 256, S = 2 * L, H = 4, Hkv = 2, D = 64;
  for (const bool on_grid : {true, false}) {
    std::vector<int32_t> ranges = row_ranges(L, on_grid ? std::vector<int>{64, 32, 160} : std::vector<int>{37, 90, 5, 124}, 16);
    const std::vector<int32_t> row1 = row_ranges(L, {256}, 16);
    ranges.insert(ranges.end(), row1.begin(), row1.end());
    const Tensor r_cpu = Tensor::from_ints(ranges, {B, 4, L});
    const Tensor r_gpu = r_cpu.to(dev, cuda);
    const int64_t wq = H * D, wk = Hkv * D;
    const Tensor q = bf16_rounded({B * S, wq}, 31, -2, 2), k = bf16_rounded({B * S, wk}, 32, -2, 2);
    const Tensor v = bf16_rounded({B * S, wk}, 33, -1, 1), dout = bf16_rounded({B * S, wq}, 34, -1, 1);
    for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
      const std::string mask_name = std::string(mask == AttentionMask::BlockDiffusion ? "block-causal clean" : "causal clean") +
                                    (on_grid ? ", documents on the block grid" : ", blocks straddling chunks");
      AttentionArgs whole{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D,
                          .mask = mask, .softmax_scale = 0.125f};
      whole.block_ranges = &r_cpu;
      Tensor out = Tensor::empty({B * S, wq}, DType::F32, Stream::cpu());
      Tensor lse = Tensor::empty({B, H, S}, DType::F32, Stream::cpu());
      ops::attention_forward(q, k, v, out, lse, whole, Stream::cpu());
      Tensor dq = Tensor::empty(q.shape(), DType::F32, Stream::cpu());
      Tensor dk = Tensor::empty(k.shape(), DType::F32, Stream::cpu()), dv = Tensor::empty(v.shape(), DType::F32, Stream::cpu());
      ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, whole, Stream::cpu());
      for (int n : {2, 4}) {
        SCOPED_TRACE(mask_name + ", ring of " + std::to_string(n));
        const int64_t local = 2 * (L / n);  // rows per batch row on a shard
        std::vector<double> got_out(static_cast<size_t>(B * S * wq)), got_dq(got_out.size());
        std::vector<double> got_dk(static_cast<size_t>(B * S * wk), 0.0), got_dv(got_dk.size(), 0.0);
        std::vector<double> got_lse(static_cast<size_t>(B * H * S)), want_lse(got_lse.size());
        const std::vector<double> lse_all = test::to_doubles(lse);
        for (int me = 0; me < n; ++me) {
          const Split mine{n, me, L};
          cp::SequenceLayout layout(2 * B, L, n, me, {});
          layout.set_block_diffusion(ranges);
          EXPECT_EQ(layout.blocks_in_chunks(n), on_grid);
          const cp::Ring ring{nullptr, mine, &layout, nullptr};
          const std::vector<int64_t> qrows = shard_rows(mine, B);
          const Tensor q_d = take(q, qrows, wq).to(dev, DType::BF16, cuda);
          const Tensor dout_d = take(dout, qrows, wq).to(dev, DType::BF16, cuda);
          Tensor acc = Tensor::zeros({B * local, wq}, DType::F32, cuda);
          Tensor acc_lse = Tensor::empty({B, H, local}, DType::F32, cuda);
          ops::fill(acc_lse, -INFINITY, cuda);
          std::vector<AttentionArgs> args(static_cast<size_t>(n));
          std::vector<Tensor> ks(static_cast<size_t>(n)), vs(static_cast<size_t>(n));
          std::vector<std::vector<int64_t>> krows(static_cast<size_t>(n));
          for (int step = 0; step < n; ++step) {  // the ring's order: own shard first
            const int src = (me - step + n) % n;
            const Split keys = mine.of_rank(src);
            AttentionArgs& a = args[static_cast<size_t>(src)];
            a = whole;
            a.block_ranges = &r_gpu;
            a.seq = local;  // ring_step_* set the chunk maps of the step
            krows[static_cast<size_t>(src)] = shard_rows(keys, B);
            ks[static_cast<size_t>(src)] = take(k, krows[static_cast<size_t>(src)], wk).to(dev, DType::BF16, cuda);
            vs[static_cast<size_t>(src)] = take(v, krows[static_cast<size_t>(src)], wk).to(dev, DType::BF16, cuda);
            Tensor o = Tensor::empty({B * local, wq}, DType::BF16, cuda);
            Tensor l = Tensor::empty({B, H, local}, DType::F32, cuda);
            cp::ring_step_forward(q_d, ks[static_cast<size_t>(src)], vs[static_cast<size_t>(src)], o, l, a, ring, src, cuda);
            ops::attention_merge(acc, acc_lse, o, l, {B, local, H, D}, cuda);
          }
          Tensor out_b = acc.to(dev, DType::BF16, cuda);
          put(got_out, test::to_doubles(acc, cuda), qrows, wq, false);
          const std::vector<double> l = test::to_doubles(acc_lse, cuda);
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t i = 0; i < local; ++i) {
                const int64_t row = qrows[static_cast<size_t>(b * local + i)] - b * S;
                got_lse[static_cast<size_t>((b * H + h) * S + row)] = l[static_cast<size_t>((b * H + h) * local + i)];
              }
          Tensor dq_acc = Tensor::zeros({B * local, wq}, DType::F32, cuda);
          for (int src = 0; src < n; ++src) {
            Tensor g_q = Tensor::empty({B * local, wq}, DType::BF16, cuda);
            Tensor g_k = Tensor::empty({B * local, wk}, DType::BF16, cuda), g_v = Tensor::empty({B * local, wk}, DType::BF16, cuda);
            cp::ring_step_backward(dout_d, q_d, ks[static_cast<size_t>(src)], vs[static_cast<size_t>(src)], out_b,
                                   acc_lse, g_q, g_k, g_v, args[static_cast<size_t>(src)], ring, src, cuda);
            Tensor wide = Tensor::empty(dq_acc.shape(), DType::F32, cuda);
            ops::copy(g_q, wide, cuda);
            ops::add(dq_acc, wide, dq_acc, cuda);
            put(got_dk, test::to_doubles(g_k, cuda), krows[static_cast<size_t>(src)], wk, true);
            put(got_dv, test::to_doubles(g_v, cuda), krows[static_cast<size_t>(src)], wk, true);
          }
          put(got_dq, test::to_doubles(dq_acc, cuda), qrows, wq, false);
        }
        const double e_out = test::rel_l2(got_out, test::to_doubles(out));
        const double e_dq = test::rel_l2(got_dq, test::to_doubles(dq));
        const double e_dk = test::rel_l2(got_dk, test::to_doubles(dk));
        const double e_dv = test::rel_l2(got_dv, test::to_doubles(dv));
        double e_lse = 0;
        for (size_t m = 0; m < got_lse.size(); ++m) e_lse = std::max(e_lse, std::abs(got_lse[m] - lse_all[m]));
        std::printf("[cp parity] block diffusion (%s) ring of %d on one GPU: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                    mask_name.c_str(), n, e_out, e_lse, e_dq, e_dk, e_dv);
        EXPECT_LT(e_out, test::kBf16ParityRelL2);
        EXPECT_LT(e_lse, 1e-2);  // bf16 inputs, f32 statistics on both sides: absolute, natural log
        EXPECT_LT(e_dq, test::kBf16ParityRelL2);
        EXPECT_LT(e_dk, test::kBf16ParityRelL2);
        EXPECT_LT(e_dv, test::kBf16ParityRelL2);
      }
    }
  }
}
