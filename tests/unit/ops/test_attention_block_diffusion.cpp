// Block diffusion's attention mask (AttentionMask::BlockDiffusion / BlockDiffusionCausal,
// include/megadlm/ops/attention.h) on the CPU:
//  - the CPU reference against a brute-force dense masked softmax built from
//    ops::block_diffusion_visible (forward out and lse, backward dq, dk, dv, in f64);
//  - the ranges the CUDA kernels derive from block_ranges (ops/attention_block_diffusion.h:
//    the keys of each query row, the queries of each key row) against the rule, pair by pair;
//  - the flash kernels' tile plans (the forward's 128-row query tiles against 32/64-key tiles,
//    the backward's 128-key tiles against 64-row query tiles) built as the kernels build them,
//    from the ranges of a tile's first and last rows: every visible pair lies in a visited tile,
//    no tile is visited twice, and the kernels' per-warp shortcuts (a tile inside every range of
//    a warp's rows needs no per-element mask; a tile outside their hull is skipped) are sound;
//  - the number of visible pairs per sequence that docs/kernels/attention.md counts FLOPs with;
//  - context-parallel shards of the doubled rows (chunk-mapped halves, keys of another shard):
//    merged over every key shard they give the whole rows' out and lse, and their backward
//    summed over the query shards the whole rows' gradients.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>
#include "megadlm/ops/attention.h"
#include "megadlm/ops/attention_merge.h"
#include "megadlm/parallel/context_parallel/sequence_split.h"
#include "ops/attention_block_diffusion.h"
#include "ops/cpu/cpu_ops.h"
#include "support/op_testing.h"

using namespace megadlm;
using megadlm::ops::AttentionArgs;
using megadlm::ops::AttentionMask;

namespace {

/// block_ranges [batch, 4, L] of packed rows: documents whose lengths cycle through
/// `doc_lengths` (starting at entry b for row b; the last document cut at L), each split into
/// diffusion blocks of `block` positions from its own start (the last block of a document may be
/// shorter). doc_lengths {L}: one document a row.
std::vector<int32_t> block_ranges(int64_t batch, int64_t L, const std::vector<int>& doc_lengths,
                                  int block) {
  std::vector<int32_t> r(static_cast<size_t>(batch * 4 * L));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t* row = r.data() + b * 4 * L;
    size_t next = static_cast<size_t>(b);
    int64_t start = 0;
    while (start < L) {
      const int64_t end = std::min<int64_t>(L, start + doc_lengths[next++ % doc_lengths.size()]);
      for (int64_t p = start; p < end; ++p) {
        const int64_t bs = start + (p - start) / block * block;
        row[p] = static_cast<int32_t>(start);
        row[L + p] = static_cast<int32_t>(end);
        row[2 * L + p] = static_cast<int32_t>(bs);
        row[3 * L + p] = static_cast<int32_t>(std::min<int64_t>(bs + block, end));
      }
      start = end;
    }
  }
  return r;
}

struct RangeCase {
  int64_t L;
  int block;
  std::vector<int> docs;
};

std::string name_of(const RangeCase& c, bool causal) {
  std::string d;
  for (int x : c.docs) d += (d.empty() ? "" : ",") + std::to_string(x);
  return "L=" + std::to_string(c.L) + " block=" + std::to_string(c.block) + " docs={" + d + "}" +
         (causal ? " causal clean half" : "");
}

// Block sizes that divide the tiles and do not, documents whose boundaries are no multiples of
// the block size (length-1 documents too), one document a row.
const std::vector<RangeCase> kRangeCases = {
    {128, 4, {128}},          {128, 4, {37, 5, 1, 60, 25}},   {256, 32, {100, 37, 200, 7}},
    {256, 128, {256}},        {256, 128, {150, 1, 90, 15}},    {512, 256, {512}},
    {512, 256, {300, 111, 101}}, {384, 48, {384}},            {384, 48, {130, 47, 1, 96, 110}},
    {96, 16, {40, 56}},       {100, 7, {33, 1, 66}},
};

bool in_ranges(int x, const int (&lo)[2], const int (&hi)[2]) {
  return (lo[0] <= x && x < hi[0]) || (lo[1] <= x && x < hi[1]);
}

// ---- the CPU reference against the dense masked softmax ----------------------------------

struct Dense {
  std::vector<double> out, lse, dq, dk, dv;
};

/// softmax(scale Q K^T masked by block_diffusion_visible) V and its gradients, written out for
/// whole [S, S] matrices per (batch, head): P, dV = P^T dO, dP = dO V^T, D = rowsum(P * dP),
/// dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q (dK, dV summed over each KV group).
Dense dense_reference(const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& dout,
                      const std::vector<int32_t>& ranges, int64_t B, int64_t S, int64_t H,
                      int64_t Hkv, int64_t D, double scale, bool causal_clean) {
  Dense r;
  r.out.assign(static_cast<size_t>(B * S * H * D), 0.0);
  r.dq = r.out;
  r.lse.assign(static_cast<size_t>(B * H * S), 0.0);
  r.dk.assign(static_cast<size_t>(B * S * Hkv * D), 0.0);
  r.dv = r.dk;
  const int64_t L = S / 2, group = H / Hkv;
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return static_cast<size_t>(((b * S + i) * H + h) * D); };
  auto ki = [&](int64_t b, int64_t j, int64_t kh) { return static_cast<size_t>(((b * S + j) * Hkv + kh) * D); };
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = ranges.data() + b * 4 * L;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / group;
      std::vector<double> P(static_cast<size_t>(S * S), 0.0), dP(P.size(), 0.0);
      for (int64_t i = 0; i < S; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        std::vector<double> s(static_cast<size_t>(S), -std::numeric_limits<double>::infinity());
        for (int64_t j = 0; j < S; ++j) {
          if (!ops::block_diffusion_visible(row, L, causal_clean, i, j)) continue;
          double x = 0;
          for (int64_t d = 0; d < D; ++d) x += q[qi(b, i, h) + d] * k[ki(b, j, kh) + d];
          s[j] = scale * x;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < S; ++j) z += std::exp(s[j] - mx);  // exp(-inf) = 0
        r.lse[static_cast<size_t>((b * H + h) * S + i)] = mx + std::log(z);
        for (int64_t j = 0; j < S; ++j) P[i * S + j] = std::exp(s[j] - mx) / z;
      }
      for (int64_t i = 0; i < S; ++i) {
        double delta = 0;
        for (int64_t j = 0; j < S; ++j) {
          double x = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[qi(b, i, h) + d] += P[i * S + j] * v[ki(b, j, kh) + d];
            x += dout[qi(b, i, h) + d] * v[ki(b, j, kh) + d];
          }
          dP[i * S + j] = x;
          delta += P[i * S + j] * x;
        }
        for (int64_t j = 0; j < S; ++j) {
          const double ds = P[i * S + j] * (dP[i * S + j] - delta);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(b, i, h) + d] += scale * ds * k[ki(b, j, kh) + d];
            r.dk[ki(b, j, kh) + d] += scale * ds * q[qi(b, i, h) + d];
            r.dv[ki(b, j, kh) + d] += P[i * S + j] * dout[qi(b, i, h) + d];
          }
        }
      }
    }
  }
  return r;
}

Tensor poisoned(const Shape& shape, DType dtype) {
  return Tensor::from_floats(std::vector<float>(static_cast<size_t>(shape_numel(shape)),
                                                std::numeric_limits<float>::quiet_NaN()),
                             shape, dtype);
}

}  // namespace

TEST(AttentionBlockDiffusion, CpuMatchesDenseMaskedSoftmax) {
  // L = 12 (seq 24), blocks of 4 over documents of 5 and 7 (block boundaries restart at each
  // document), one row a single document with blocks of 5 (the last block short); GQA 4/2.
  const int64_t B = 2, L = 12, S = 2 * L, H = 4, Hkv = 2, D = 8;
  std::vector<int32_t> ranges = block_ranges(1, L, {5, 7}, 4);
  const std::vector<int32_t> row1 = block_ranges(1, L, {12}, 5);
  ranges.insert(ranges.end(), row1.begin(), row1.end());
  const Tensor r = Tensor::from_ints(ranges, {B, 4, L});
  const Tensor q = test::random_tensor({B, S, H, D}, 11, DType::F64, -1.5f, 1.5f);
  const Tensor k = test::random_tensor({B, S, Hkv, D}, 12, DType::F64, -1.5f, 1.5f);
  const Tensor v = test::random_tensor({B, S, Hkv, D}, 13, DType::F64);
  const Tensor dout = test::random_tensor({B, S, H, D}, 14, DType::F64);
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    const bool causal = mask == AttentionMask::BlockDiffusionCausal;
    SCOPED_TRACE(causal ? "BlockDiffusionCausal" : "BlockDiffusion");
    AttentionArgs a{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D,
                    .mask = mask, .softmax_scale = 0.35f};
    a.block_ranges = &r;
    const Dense want = dense_reference(test::to_doubles(q), test::to_doubles(k), test::to_doubles(v),
                                       test::to_doubles(dout), ranges, B, S, H, Hkv, D,
                                       static_cast<double>(a.softmax_scale), causal);
    // The public op (f32 lse, the contract) and the CPU backend with an f64 lse, whose backward
    // is then exact up to f64 rounding.
    Tensor out = poisoned({B, S, H, D}, DType::F64), lse32 = poisoned({B, H, S}, DType::F32);
    ops::attention_forward(q, k, v, out, lse32, a, Stream::cpu());
    EXPECT_LT(test::max_abs_diff(test::to_doubles(out), want.out), 1e-12);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(lse32), want.lse), 1e-6);
    Tensor out64 = poisoned({B, S, H, D}, DType::F64), lse64 = poisoned({B, H, S}, DType::F64);
    ops::cpu::attention_forward(q, k, v, out64, lse64, a, Stream::cpu());
    EXPECT_LT(test::max_abs_diff(test::to_doubles(lse64), want.lse), 1e-12);
    Tensor dq = poisoned({B, S, H, D}, DType::F64), dk = poisoned({B, S, Hkv, D}, DType::F64),
           dv = poisoned({B, S, Hkv, D}, DType::F64);
    ops::cpu::attention_backward(dout, q, k, v, out64, lse64, dq, dk, dv, a, Stream::cpu());
    EXPECT_LT(test::max_abs_diff(test::to_doubles(dq), want.dq), 1e-12);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(dk), want.dk), 1e-12);
    EXPECT_LT(test::max_abs_diff(test::to_doubles(dv), want.dv), 1e-12);
    // The mask matters: the dense reference without it is far from the op.
    EXPECT_GT(test::max_abs_diff(test::to_doubles(out), std::vector<double>(want.out.size(), 0.0)), 0.1);
  }
}

/// Rows [B, 2L, W] of whole doubled rows -> shard `sp`'s rows [B, 2·L/n, W]: its positions'
/// noisy copies, then their clean copies (the context-parallel layout of block diffusion).
std::vector<int64_t> shard_rows_of(const cp::Split& sp, int64_t B) {
  const int64_t L = sp.seq, h = sp.local_len();
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t copy = 0; copy < 2; ++copy)
      for (int64_t i = 0; i < h; ++i) rows.push_back(b * 2 * L + copy * L + sp.global(i));
  return rows;
}

Tensor gather(const Tensor& x, const std::vector<int64_t>& rows, int64_t width) {
  Tensor out = Tensor::zeros({static_cast<int64_t>(rows.size()), width}, DType::F64, Stream::cpu());
  for (size_t m = 0; m < rows.size(); ++m)
    std::copy_n(x.data<double>() + rows[m] * width, width, out.data<double>() + m * width);
  return out;
}

/// acc[rows[m]] += x[m] (x [rows, width]).
void scatter_add(std::vector<double>& acc, const Tensor& x, const std::vector<int64_t>& rows, int64_t width) {
  for (size_t m = 0; m < rows.size(); ++m)
    for (int64_t d = 0; d < width; ++d) acc[static_cast<size_t>(rows[m] * width + d)] += x.data<double>()[m * width + d];
}

TEST(AttentionBlockDiffusion, ContextParallelShardsGiveTheWholeRows) {
  // L = 16 over 2 and 4 shards (chunks of 4 and 2); blocks of 2 in documents of 5, 3, 8 (blocks
  // straddle the chunks where a document starts inside one) and one document a row; GQA 4/2.
  const int64_t B = 2, L = 16, S = 2 * L, H = 4, Hkv = 2, D = 4;
  std::vector<int32_t> ranges = block_ranges(1, L, {5, 3, 8}, 2);
  const std::vector<int32_t> row1 = block_ranges(1, L, {16}, 2);
  ranges.insert(ranges.end(), row1.begin(), row1.end());
  const Tensor r = Tensor::from_ints(ranges, {B, 4, L});
  const Tensor q = test::random_tensor({B, S, H, D}, 21, DType::F64, -1.5f, 1.5f);
  const Tensor k = test::random_tensor({B, S, Hkv, D}, 22, DType::F64, -1.5f, 1.5f);
  const Tensor v = test::random_tensor({B, S, Hkv, D}, 23, DType::F64);
  const Tensor dout = test::random_tensor({B, S, H, D}, 24, DType::F64);
  for (AttentionMask mask : {AttentionMask::BlockDiffusion, AttentionMask::BlockDiffusionCausal}) {
    SCOPED_TRACE(mask == AttentionMask::BlockDiffusionCausal ? "BlockDiffusionCausal" : "BlockDiffusion");
    AttentionArgs whole{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = Hkv, .head_dim = D,
                        .mask = mask, .softmax_scale = 0.35f};
    whole.block_ranges = &r;
    Tensor out = poisoned({B, S, H, D}, DType::F64), lse = poisoned({B, H, S}, DType::F64);
    ops::cpu::attention_forward(q, k, v, out, lse, whole, Stream::cpu());
    Tensor dq = poisoned({B, S, H, D}, DType::F64), dk = poisoned({B, S, Hkv, D}, DType::F64),
           dv = poisoned({B, S, Hkv, D}, DType::F64);
    ops::cpu::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, whole, Stream::cpu());
    for (int n : {2, 4}) {
      SCOPED_TRACE("shards " + std::to_string(n));
      const int64_t h = L / n, rows = B * 2 * h;
      std::vector<double> got_out(static_cast<size_t>(B * S * H * D), 0.0), got_dq = got_out;
      std::vector<double> got_dk(static_cast<size_t>(B * S * Hkv * D), 0.0), got_dv = got_dk;
      std::vector<double> got_lse(static_cast<size_t>(B * H * S), 0.0);
      int64_t blocks_without_keys = 0;
      for (int me = 0; me < n; ++me) {
        const cp::Split qs{n, me, L};
        const std::vector<int64_t> qrows = shard_rows_of(qs, B);
        const Tensor q_l = gather(q, qrows, H * D), dout_l = gather(dout, qrows, H * D);
        // Merge over every key shard, as the ring does.
        Tensor acc = Tensor::zeros({rows, H * D}, DType::F64, Stream::cpu());
        Tensor acc_lse = Tensor::zeros({B, H, 2 * h}, DType::F64, Stream::cpu());
        for (int64_t m = 0; m < acc_lse.numel(); ++m) acc_lse.data<double>()[m] = -INFINITY;
        std::vector<AttentionArgs> block_args;
        for (int src = 0; src < n; ++src) {
          const cp::Split ks = qs.of_rank(src);
          AttentionArgs a = whole;
          a.seq = 2 * h;
          a.query_chunks = qs.chunks();
          a.key_chunks = ks.chunks();
          block_args.push_back(a);
          const std::vector<int64_t> krows = shard_rows_of(ks, B);
          Tensor o = poisoned({rows, H * D}, DType::F64), l = poisoned({B, H, 2 * h}, DType::F64);
          ops::attention_forward(q_l, gather(k, krows, Hkv * D), gather(v, krows, Hkv * D), o, l, a, Stream::cpu());
          for (int64_t m = 0; m < l.numel(); ++m) blocks_without_keys += std::isinf(l.data<double>()[m]);
          ops::attention_merge(acc, acc_lse, o, l, {B, 2 * h, H, D}, Stream::cpu());
        }
        scatter_add(got_out, acc, qrows, H * D);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t hh = 0; hh < H; ++hh)
            for (int64_t i = 0; i < 2 * h; ++i)
              got_lse[static_cast<size_t>((b * H + hh) * S + qrows[static_cast<size_t>(b * 2 * h + i)] - b * S)] =
                  acc_lse.data<double>()[(b * H + hh) * 2 * h + i];
        // Backward of every block with the merged out and lse; dK/dV land on the key shard's rows.
        for (int src = 0; src < n; ++src) {
          const std::vector<int64_t> krows = shard_rows_of(qs.of_rank(src), B);
          Tensor g_q = poisoned({rows, H * D}, DType::F64), g_k = poisoned({rows, Hkv * D}, DType::F64),
                 g_v = poisoned({rows, Hkv * D}, DType::F64);
          ops::attention_backward(dout_l, q_l, gather(k, krows, Hkv * D), gather(v, krows, Hkv * D), acc, acc_lse,
                                  g_q, g_k, g_v, block_args[static_cast<size_t>(src)], Stream::cpu());
          scatter_add(got_dq, g_q, qrows, H * D);
          scatter_add(got_dk, g_k, krows, Hkv * D);
          scatter_add(got_dv, g_v, krows, Hkv * D);
        }
      }
      EXPECT_GT(blocks_without_keys, 0);  // the shards' blocks are really masked
      EXPECT_LT(test::max_abs_diff(got_out, test::to_doubles(out)), 1e-12);
      EXPECT_LT(test::max_abs_diff(got_lse, test::to_doubles(lse)), 1e-12);
      EXPECT_LT(test::max_abs_diff(got_dq, test::to_doubles(dq)), 1e-12);
      EXPECT_LT(test::max_abs_diff(got_dk, test::to_doubles(dk)), 1e-12);
      EXPECT_LT(test::max_abs_diff(got_dv, test::to_doubles(dv)), 1e-12);
    }
  }
}

TEST(AttentionBlockDiffusion, CpuRefusesWhatTheMaskDoesNotCombineWith) {
  const int64_t B = 1, L = 8, S = 16, H = 2, D = 4;
  const Tensor r = Tensor::from_ints(block_ranges(B, L, {L}, 4), {B, 4, L});
  const Tensor q = test::random_tensor({B, S, H, D}, 1), k = q, v = q;
  Tensor out = poisoned({B, S, H, D}, DType::F32), lse = poisoned({B, H, S}, DType::F32);
  AttentionArgs a{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = H, .head_dim = D,
                  .mask = AttentionMask::BlockDiffusion, .softmax_scale = 0.5f};
  EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, a, Stream::cpu()), Error);  // no ranges
  a.block_ranges = &r;
  ops::attention_forward(q, k, v, out, lse, a, Stream::cpu());
  a.dropout_p = 0.1f;
  EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, a, Stream::cpu()), Error);
  a.dropout_p = 0.0f;
  a.query_chunks = {2, 0, 3};  // a shard's halves are 4 rows, not all L = 8
  EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, a, Stream::cpu()), Error);
  a.query_chunks = {};
  a.mask = AttentionMask::Causal;  // ranges without the mask
  EXPECT_THROW(ops::attention_forward(q, k, v, out, lse, a, Stream::cpu()), Error);
}

TEST(BlockDiffusionRanges, KeysAndQueriesOfEveryRowAreExactlyTheVisibleOnes) {
  for (const RangeCase& c : kRangeCases)
    for (bool causal : {false, true}) {
      SCOPED_TRACE(name_of(c, causal));
      const std::vector<int32_t> ranges = block_ranges(2, c.L, c.docs, c.block);
      for (int64_t b = 0; b < 2; ++b) {
        const int32_t* row = ranges.data() + b * 4 * c.L;
        const ops::detail::BlockDiffusionRow bd{row, static_cast<int>(c.L), causal};
        const int S = static_cast<int>(2 * c.L);
        int64_t wrong = 0;
        for (int i = 0; i < S; ++i) {
          int klo[2], khi[2];
          bd.keys_of(i, klo, khi);
          EXPECT_TRUE(in_ranges(i, klo, khi)) << "row " << i << " does not see its own key";
          for (int j = 0; j < S; ++j) {
            int qlo[2], qhi[2];
            bd.queries_of(j, qlo, qhi);
            const bool want = ops::block_diffusion_visible(row, c.L, causal, i, j);
            wrong += bd.visible(i, j) != want;
            wrong += in_ranges(j, klo, khi) != want;
            wrong += in_ranges(i, qlo, qhi) != want;
          }
        }
        EXPECT_EQ(wrong, 0) << "batch row " << b;
      }
    }
}

TEST(BlockDiffusionRanges, RangeEndsAreNonDecreasingWithinEachHalf) {
  // What the flash kernels' tile plans and per-warp tests rely on.
  for (const RangeCase& c : kRangeCases)
    for (bool causal : {false, true}) {
      SCOPED_TRACE(name_of(c, causal));
      const std::vector<int32_t> ranges = block_ranges(1, c.L, c.docs, c.block);
      const ops::detail::BlockDiffusionRow bd{ranges.data(), static_cast<int>(c.L), causal};
      for (int half = 0; half < 2; ++half)
        for (int x = half * static_cast<int>(c.L) + 1; x < (half + 1) * c.L; ++x) {
          int a_lo[2], a_hi[2], b_lo[2], b_hi[2], c_lo[2], c_hi[2], d_lo[2], d_hi[2];
          bd.keys_of(x - 1, a_lo, a_hi);
          bd.keys_of(x, b_lo, b_hi);
          bd.queries_of(x - 1, c_lo, c_hi);
          bd.queries_of(x, d_lo, d_hi);
          for (int s = 0; s < 2; ++s) {
            EXPECT_LE(a_lo[s], b_lo[s]) << x;
            EXPECT_LE(a_hi[s], b_hi[s]) << x;
            EXPECT_LE(c_lo[s], d_lo[s]) << x;
            EXPECT_LE(c_hi[s], d_hi[s]) << x;
          }
        }
    }
}

TEST(BlockDiffusionRanges, FlashTilePlansCoverEveryVisiblePairOnce) {
  // The kernels' plans for L a multiple of 128 (the support table's condition for them).
  struct Plan {
    const char* what;
    int rows, cols, warp_rows;  // the tile of rows (block), the tiles of the other side, a warp
    bool forward;
  };
  const Plan plans[] = {{"forward D=64 (128 x 64)", 128, 64, 32, true},
                        {"forward D=128 (128 x 32)", 128, 32, 32, true},
                        {"backward (128 keys x 64 queries)", 128, 64, 16, false}};
  for (const RangeCase& c : kRangeCases) {
    if (c.L % 128 != 0) continue;
    // One document a row: also the composed path's strips (BlockDiffusionRow::strip = the block
    // size; ops/attention_block_diffusion_bulk.h), which run on the same plans.
    const bool one_document = c.docs.size() == 1 && c.docs[0] >= c.L;
    for (int strip : one_document ? std::vector<int>{0, c.block} : std::vector<int>{0})
    for (bool causal : {false, true})
      for (const Plan& plan : plans) {
        SCOPED_TRACE(name_of(c, causal) + " " + plan.what + (strip ? " strip" : ""));
        const std::vector<int32_t> ranges = block_ranges(2, c.L, c.docs, c.block);
        int64_t visited_tiles = 0, needed_tiles = 0, masked_warp_tiles = 0, warp_tiles = 0;
        for (int64_t b = 0; b < 2; ++b) {
          const int32_t* row = ranges.data() + b * 4 * c.L;
          const ops::detail::BlockDiffusionRow bd{row, static_cast<int>(c.L), causal, strip};
          const int S = static_cast<int>(2 * c.L);
          // Ranges of row x on the other side: keys_of in the forward, queries_of in the backward.
          auto range_of = [&](int x, int (&lo)[2], int (&hi)[2]) {
            if (plan.forward) bd.keys_of(x, lo, hi);
            else bd.queries_of(x, lo, hi);
          };
          auto seen = [&](int x, int y) { return plan.forward ? bd.visible(x, y) : bd.visible(y, x); };
          for (int r0 = 0; r0 < S; r0 += plan.rows) {
            int lo_first[2], hi_first[2], lo_last[2], hi_last[2];
            range_of(r0, lo_first, hi_first);
            range_of(r0 + plan.rows - 1, lo_last, hi_last);
            const auto tiles = ops::detail::BlockDiffusionTiles::of(lo_first, hi_last, plan.cols);
            ASSERT_GE(tiles.total(), 1);
            std::set<int> visited;
            for (int n = 0; n < tiles.total(); ++n) {
              const int tile = tiles.tile(n);
              ASSERT_GE(tile, 0);
              ASSERT_LT(tile, S / plan.cols);
              EXPECT_TRUE(visited.insert(tile).second) << "tile " << tile << " visited twice";
              // Both sides of a tile lie in one half.
              EXPECT_EQ(tile * plan.cols < c.L, (tile + 1) * plan.cols <= c.L);
              // Which of a row's two ranges applies to this tile: the forward takes the plan's
              // range (the noisy, then the clean keys), the backward the query tile's half.
              const int range = plan.forward ? (n < tiles.count[0] ? 0 : 1)
                                             : (tile * plan.cols >= c.L ? 1 : 0);
              // Per warp: the kernels' shortcuts from the ranges of its first and last rows.
              for (int w0 = r0; w0 < r0 + plan.rows; w0 += plan.warp_rows) {
                int wlo_first[2], whi_first[2], wlo_last[2], whi_last[2];
                range_of(w0, wlo_first, whi_first);
                range_of(w0 + plan.warp_rows - 1, wlo_last, whi_last);
                const int y0 = tile * plan.cols, y1 = y0 + plan.cols;
                const bool uniform = y0 >= wlo_last[range] && y1 <= whi_first[range];
                const bool active = y0 < whi_last[range] && y1 > wlo_first[range];
                bool any = false, all = true;
                for (int x = w0; x < w0 + plan.warp_rows; ++x) {
                  int lo[2], hi[2];
                  range_of(x, lo, hi);
                  for (int y = y0; y < y1; ++y) {
                    const bool v = seen(x, y);
                    any = any || v;
                    all = all && v;
                    // The mask the kernels apply: the row's range of this tile's half.
                    EXPECT_EQ(v, lo[range] <= y && y < hi[range]) << "x " << x << " y " << y;
                  }
                }
                if (uniform) {
                  EXPECT_TRUE(all) << "tile " << tile << " warp rows from " << w0;
                }
                if (plan.forward && !active) {
                  EXPECT_FALSE(any) << "tile " << tile << " warp rows from " << w0;
                }
                ++warp_tiles;
                masked_warp_tiles += !uniform;
              }
            }
            // Coverage: every visible pair of these rows lies in a visited tile.
            std::set<int> needed;
            for (int x = r0; x < r0 + plan.rows; ++x)
              for (int y = 0; y < S; ++y)
                if (seen(x, y)) {
                  needed.insert(y / plan.cols);
                  EXPECT_TRUE(visited.count(y / plan.cols)) << "row " << x << " col " << y;
                }
            visited_tiles += static_cast<int64_t>(visited.size());
            needed_tiles += static_cast<int64_t>(needed.size());
          }
        }
        std::printf("[block diffusion plan%s] %-40s %-34s tiles visited %lld (needed %lld), "
                    "warp tiles masked per element %lld of %lld\n",
                    strip ? " strip" : "", name_of(c, causal).c_str(), plan.what, static_cast<long long>(visited_tiles),
                    static_cast<long long>(needed_tiles), static_cast<long long>(masked_warp_tiles),
                    static_cast<long long>(warp_tiles));
        EXPECT_GE(visited_tiles, needed_tiles);
      }
  }
}

TEST(BlockDiffusionRanges, MalformedRangesStayInsideTheRow) {
  // Positions out of [0, L] are clamped as they are read: the kernels may compute a wrong mask
  // for such input but never address another row.
  const int L = 8;
  std::vector<int32_t> r(4 * L);
  for (int p = 0; p < L; ++p) {
    r[p] = -100;
    r[L + p] = 1000;
    r[2 * L + p] = p + 50;
    r[3 * L + p] = -3;
  }
  const ops::detail::BlockDiffusionRow bd{r.data(), L, false};
  for (int x = 0; x < 2 * L; ++x) {
    int lo[2], hi[2];
    bd.keys_of(x, lo, hi);
    for (int s = 0; s < 2; ++s) {
      EXPECT_GE(lo[s], 0);
      EXPECT_LE(hi[s], 2 * L);
    }
    bd.queries_of(x, lo, hi);
    for (int s = 0; s < 2; ++s) {
      EXPECT_GE(lo[s], 0);
      EXPECT_LE(hi[s], 2 * L);
    }
  }
}

TEST(BlockDiffusionRanges, VisiblePairsPerSequence) {
  // One document of L positions in blocks of B (B divides L): BD3's mask has L B + L^2 visible
  // pairs (noisy-noisy L B, noisy-clean (L^2 - L B) / 2, clean-clean (L^2 + L B) / 2), the
  // causal variant L^2 + L B / 2 + L / 2 (clean-clean L (L + 1) / 2). docs/kernels/attention.md
  // counts FLOPs with these.
  for (int64_t L : {16, 96, 256})
    for (int B : {1, 4, 16})
      for (bool causal : {false, true}) {
        const std::vector<int32_t> r = block_ranges(1, L, {static_cast<int>(L)}, B);
        int64_t pairs = 0;
        for (int64_t i = 0; i < 2 * L; ++i)
          for (int64_t j = 0; j < 2 * L; ++j) pairs += ops::block_diffusion_visible(r.data(), L, causal, i, j);
        EXPECT_EQ(pairs, causal ? L * L + L * B / 2 + L / 2 : L * B + L * L)
            << "L " << L << " B " << B << (causal ? " causal" : "");
      }
}
