// Blockwise FP8 scaling (--fp8-recipe blockwise; include/megadlm/ops/fp8.h "blockwise scaling",
// docs/fp8.md "Blockwise scaling"): the scale-grid layouts of cuBLASLt's VEC128_32F and
// BLK128x128_32F modes (docs/fp8.md "Scale-grid layout"), the per-tile scale rule with hand-checked numbers,
// partial last tiles, the block-scaled GEMM emulation, and the Tensor-level CPU ops the FP8
// linears call (both orientations, the three GEMMs of a linear).
#include <gtest/gtest.h>
#include <cmath>
#include <vector>
#include "megadlm/core/tensor.h"
#include "megadlm/ops/fp8.h"
#include "megadlm/ops/fp8_gemm.h"
#include "megadlm/ops/gemm.h"

using namespace megadlm;
using namespace megadlm::ops;

namespace {

constexpr Fp8Granularity kTile = Fp8Granularity::Tile1x128;
constexpr Fp8Granularity kBlock = Fp8Granularity::Block128x128;

std::vector<float> pseudo_random(size_t n, uint32_t seed, float spread) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1u;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float u = static_cast<float>(s >> 8) / 16777216.0f;  // [0, 1)
    // Magnitudes over several binades so that tiles get different scales.
    v[i] = (u - 0.5f) * std::ldexp(1.0f, static_cast<int>((s >> 4) % 7) - 3) * spread;
  }
  return v;
}

}  // namespace

TEST(Fp8Blockwise, GridSizesAndIndicesFollowCublasLtLayouts) {
  // VEC128 of a [5, 384] operand: KB = 3, rows padded to 8; (r, kb) at kb * 8 + r.
  EXPECT_EQ(fp8_pad4(5), 8);
  EXPECT_EQ(fp8_block_grid_size(kTile, 5, 384), 24);
  EXPECT_EQ(fp8_block_grid_index(kTile, 5, 384, 2, 300), 2 * 8 + 2);
  EXPECT_EQ(fp8_block_grid_index(kTile, 5, 384, 4, 127), 4);
  EXPECT_EQ(fp8_block_grid_index(kTile, 5, 384, 0, 128), 8);
  // A partial last K-block counts: k = 200 gives KB = 2.
  EXPECT_EQ(fp8_block_grid_size(kTile, 1, 200), 2 * 4);
  // BLK128x128 of a [300, 640] operand: RB = 3, KB = 5 padded to 8; (rb, kb) at rb * 8 + kb.
  EXPECT_EQ(fp8_block_grid_size(kBlock, 300, 640), 3 * 8);
  EXPECT_EQ(fp8_block_grid_index(kBlock, 300, 640, 200, 520), 1 * 8 + 4);
  EXPECT_EQ(fp8_block_grid_index(kBlock, 300, 640, 299, 639), 2 * 8 + 4);
  // The transposed operand [640, 300] of the same matrix: (cb, rb) at cb * pad4(3) + rb.
  EXPECT_EQ(fp8_block_grid_index(kBlock, 640, 300, 520, 200), 4 * 4 + 1);
  EXPECT_EQ(fp8_block_grid_size(Fp8Granularity::Tensor, 7, 9), 1);
}

TEST(Fp8Blockwise, TileScaleComesFromTheTilesOwnAmax) {
  // One row, k = 256: tile 0 has amax 3.5 (s = 448 / 3.5 = 128, a power of two already),
  // tile 1 amax 5 (s = 89.6, rounded down to 64 with power-of-2 scales).
  std::vector<float> x(256, 0.0f);
  x[0] = 0.0123f;
  x[7] = -3.5f;
  x[128] = 5.0f;
  x[200] = 1.0f;
  std::vector<uint8_t> codes(256);
  std::vector<float> grid(static_cast<size_t>(fp8_block_grid_size(kTile, 1, 256)));
  ASSERT_EQ(grid.size(), 8u);
  fp8_quantize_blockwise(x, 1, 256, kTile, Fp8Type::E4M3, /*power_of_2=*/true, codes, grid);
  EXPECT_EQ(grid[0], 1.0f / 128.0f);
  EXPECT_EQ(grid[4], 1.0f / 64.0f);
  for (size_t i : {1u, 2u, 3u, 5u, 6u, 7u}) EXPECT_EQ(grid[i], 0.0f) << "padding entry " << i;
  // 0.0123 · 128 = 1.5744 → 1.625 (spacing 0.125 in [1, 2)): e4m3 0.0111.101 = 0x3D.
  EXPECT_EQ(codes[0], 0x3D);
  EXPECT_EQ(fp8_decode(codes[0], Fp8Type::E4M3) * grid[0], 1.625f / 128.0f);
  EXPECT_EQ(codes[7], 0x80 | 0x7E);                          // -3.5 · 128 = -448 = -max
  EXPECT_EQ(fp8_decode(codes[128], Fp8Type::E4M3), 320.0f);  // 5 · 64
  EXPECT_EQ(fp8_decode(codes[200], Fp8Type::E4M3), 64.0f);
  // fp32 scales (power_of_2 off): s = 448 / 5 = 89.6f; 1 · 89.6 → 88 (spacing 8 in [64, 128)).
  fp8_quantize_blockwise(x, 1, 256, kTile, Fp8Type::E4M3, /*power_of_2=*/false, codes, grid);
  EXPECT_EQ(grid[4], 1.0f / (448.0f / 5.0f));
  EXPECT_EQ(fp8_decode(codes[200], Fp8Type::E4M3), 88.0f);
  EXPECT_EQ(fp8_decode(codes[128], Fp8Type::E4M3), 448.0f);
}

TEST(Fp8Blockwise, PartialLastTileAndZeroTile) {
  // Two rows, k = 200: the second K-block holds 72 elements. Row 0's last tile has amax 7
  // (s = 64), row 1 is all zero (scale 1, zero codes).
  std::vector<float> x(400, 0.0f);
  x[1] = 0.25f;   // row 0, tile 0: amax 0.25 → s = 1792 → 1024
  x[199] = 7.0f;  // row 0, tile 1 (partial)
  std::vector<uint8_t> codes(400);
  std::vector<float> grid(static_cast<size_t>(fp8_block_grid_size(kTile, 2, 200)));
  ASSERT_EQ(grid.size(), 8u);  // KB 2 x pad4(2)
  fp8_quantize_blockwise(x, 2, 200, kTile, Fp8Type::E4M3, true, codes, grid);
  EXPECT_EQ(grid[fp8_block_grid_index(kTile, 2, 200, 0, 0)], 1.0f / 1024.0f);
  EXPECT_EQ(grid[fp8_block_grid_index(kTile, 2, 200, 0, 199)], 1.0f / 64.0f);
  EXPECT_EQ(fp8_block_grid_index(kTile, 2, 200, 0, 199), 4);
  EXPECT_EQ(grid[fp8_block_grid_index(kTile, 2, 200, 1, 0)], 1.0f);
  EXPECT_EQ(grid[fp8_block_grid_index(kTile, 2, 200, 1, 150)], 1.0f);
  EXPECT_EQ(fp8_decode(codes[199], Fp8Type::E4M3), 448.0f);
  for (int i = 200; i < 400; ++i) ASSERT_EQ(codes[static_cast<size_t>(i)], 0);
}

TEST(Fp8Blockwise, BlockScaleCoversA128x128BlockAndItsTranspose) {
  // [130, 256]: row-blocks 0 (rows 0..127) and 1 (rows 128, 129, partial); K-blocks 0, 1.
  const int64_t rows = 130, k = 256;
  std::vector<float> x(static_cast<size_t>(rows * k), 0.01f);
  x[static_cast<size_t>(129 * k + 200)] = -14.0f;  // block (1, 1): s = 32
  x[static_cast<size_t>(5 * k + 3)] = 1.75f;       // block (0, 0): s = 256
  std::vector<uint8_t> codes(x.size());
  std::vector<float> grid(static_cast<size_t>(fp8_block_grid_size(kBlock, rows, k)));
  ASSERT_EQ(grid.size(), 2u * 4u);
  fp8_quantize_blockwise(x, rows, k, kBlock, Fp8Type::E4M3, true, codes, grid);
  EXPECT_EQ(grid[0 * 4 + 0], 1.0f / 256.0f);
  EXPECT_EQ(grid[1 * 4 + 1], 1.0f / 32.0f);
  EXPECT_EQ(grid[0 * 4 + 1], 1.0f / 32768.0f);  // amax 0.01: 44800 → 32768
  EXPECT_EQ(grid[1 * 4 + 0], 1.0f / 32768.0f);
  EXPECT_EQ(grid[2], 0.0f);
  EXPECT_EQ(grid[7], 0.0f);
  // The transposed matrix has the same blocks: its grid is the transpose, its codes too.
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) xt[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * k + c)];
  std::vector<uint8_t> codes_t(x.size());
  std::vector<float> grid_t(static_cast<size_t>(fp8_block_grid_size(kBlock, k, rows)));
  fp8_quantize_blockwise(xt, k, rows, kBlock, Fp8Type::E4M3, true, codes_t, grid_t);
  for (int64_t rb = 0; rb < 2; ++rb)
    for (int64_t cb = 0; cb < 2; ++cb)
      EXPECT_EQ(grid_t[static_cast<size_t>(fp8_block_grid_index(kBlock, k, rows, cb * 128, rb * 128))],
                grid[static_cast<size_t>(fp8_block_grid_index(kBlock, rows, k, rb * 128, cb * 128))]);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(codes_t[static_cast<size_t>(c * rows + r)], codes[static_cast<size_t>(r * k + c)]);
}

TEST(Fp8Blockwise, GemmReferenceAppliesEachKBlocksScales) {
  // m = n = 1, k = 256, all codes 1.0: d = 128 · sa0 · sb0 + 128 · sa1 · sb1.
  const uint8_t one = fp8_encode(1.0f, Fp8Type::E4M3);
  std::vector<uint8_t> a(256, one), b(256, one);
  std::vector<float> sa = {0.5f, 0, 0, 0, 2.0f, 0, 0, 0};  // VEC128 of [1, 256]
  std::vector<float> sb = {1.0f, 0.25f, 0, 0};            // BLK128x128 of [1, 256]
  std::vector<float> d(1);
  fp8_block_gemm_reference(a, Fp8Type::E4M3, kTile, sa, b, Fp8Type::E4M3, kBlock, sb, 1, 1, 256, 1.0f, d);
  EXPECT_EQ(d[0], 128.0f * 0.5f + 128.0f * 2.0f * 0.25f);
  EXPECT_THROW(fp8_block_gemm_reference(a, Fp8Type::E4M3, kBlock, sb, b, Fp8Type::E4M3, kBlock, sb, 1, 1, 256,
                                        1.0f, d),
               std::exception);
}

TEST(Fp8Blockwise, QuantizedGemmTracksTheFp32Gemm) {
  // y = x wᵀ with x 1x128-tiled and w 128x128-blocked: within e4m3's rounding of the fp32 GEMM.
  const int64_t t = 64, in = 256, out = 128;
  const std::vector<float> x = pseudo_random(static_cast<size_t>(t * in), 1, 4.0f);
  const std::vector<float> w = pseudo_random(static_cast<size_t>(out * in), 2, 0.1f);
  std::vector<uint8_t> xq(x.size()), wq(w.size());
  std::vector<float> xs(static_cast<size_t>(fp8_block_grid_size(kTile, t, in)));
  std::vector<float> ws(static_cast<size_t>(fp8_block_grid_size(kBlock, out, in)));
  fp8_quantize_blockwise(x, t, in, kTile, Fp8Type::E4M3, true, xq, xs);
  fp8_quantize_blockwise(w, out, in, kBlock, Fp8Type::E4M3, true, wq, ws);
  std::vector<float> y(static_cast<size_t>(t * out));
  fp8_block_gemm_reference(wq, Fp8Type::E4M3, kBlock, ws, xq, Fp8Type::E4M3, kTile, xs, out, t, in, 1.0f, y);
  double num = 0, den = 0;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0;
      for (int64_t p = 0; p < in; ++p) ref += static_cast<double>(x[static_cast<size_t>(i * in + p)]) * w[static_cast<size_t>(o * in + p)];
      const double e = y[static_cast<size_t>(i * out + o)] - ref;
      num += e * e;
      den += ref * ref;
    }
  EXPECT_LT(std::sqrt(num / den), 0.05) << "relative L2 of the blockwise FP8 GEMM";
}

// The Tensor-level CPU ops: both orientations of an activation (1x128 tiles along cols for the
// row-wise codes, along rows for the column-wise ones), the weight's two orientations, and the
// three GEMMs of a linear, each against fp8_block_gemm_reference on the same codes and grids.
TEST(Fp8Blockwise, TensorOpsMatchTheHostReferenceForTheThreeGemms) {
  const Stream& s = Stream::cpu();
  const int64_t t = 256, in = 128, out = 384;
  const std::vector<float> xv = pseudo_random(static_cast<size_t>(t * in), 3, 2.0f);
  const std::vector<float> wv = pseudo_random(static_cast<size_t>(out * in), 4, 0.05f);
  const std::vector<float> dyv = pseudo_random(static_cast<size_t>(t * out), 5, 0.01f);
  const Tensor x = Tensor::from_floats(xv, {t, in}), w = Tensor::from_floats(wv, {out, in}),
               dy = Tensor::from_floats(dyv, {t, out});
  const Fp8Tensor xq = fp8_quantize_blockwise(x, Fp8Type::E4M3, kTile, true, true, true, s);
  const Fp8Tensor wq = fp8_quantize_blockwise(w, Fp8Type::E4M3, kBlock, true, true, true, s);
  const Fp8Tensor dyq = fp8_quantize_blockwise(dy, Fp8Type::E5M2, kTile, true, true, true, s);

  // Host codes of a [rows, k] operand, quantized from `src` (already K-contiguous).
  struct Host {
    std::vector<uint8_t> codes;
    std::vector<float> grid;
  };
  auto host = [](const std::vector<float>& src, int64_t rows, int64_t k, Fp8Granularity g, Fp8Type type) {
    Host h{std::vector<uint8_t>(src.size()), std::vector<float>(static_cast<size_t>(fp8_block_grid_size(g, rows, k)))};
    fp8_quantize_blockwise(src, rows, k, g, type, true, h.codes, h.grid);
    return h;
  };
  auto transpose = [](const std::vector<float>& v, int64_t rows, int64_t cols) {
    std::vector<float> o(v.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) o[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
    return o;
  };
  const Host hx = host(xv, t, in, kTile, Fp8Type::E4M3), hxt = host(transpose(xv, t, in), in, t, kTile, Fp8Type::E4M3);
  const Host hw = host(wv, out, in, kBlock, Fp8Type::E4M3), hwt = host(transpose(wv, out, in), in, out, kBlock, Fp8Type::E4M3);
  const Host hdy = host(dyv, t, out, kTile, Fp8Type::E5M2), hdyt = host(transpose(dyv, t, out), out, t, kTile, Fp8Type::E5M2);

  // The Tensor ops' decoded codes and grids are the host's.
  auto same = [](const Tensor& data, const Tensor& grid, const Host& h, Fp8Type type, const char* what) {
    const std::vector<float> d = data.to_floats(Stream::cpu()), g = grid.to_floats(Stream::cpu());
    ASSERT_EQ(d.size(), h.codes.size()) << what;
    ASSERT_EQ(g.size(), h.grid.size()) << what;
    for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(d[i], fp8_decode(h.codes[i], type)) << what << " code " << i;
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], h.grid[i]) << what << " grid " << i;
  };
  same(xq.data, xq.scale_inv, hx, Fp8Type::E4M3, "x row-wise");
  same(xq.data_t, xq.scale_inv_t, hxt, Fp8Type::E4M3, "x column-wise");
  same(wq.data, wq.scale_inv, hw, Fp8Type::E4M3, "w row-wise");
  same(wq.data_t, wq.scale_inv_t, hwt, Fp8Type::E4M3, "w column-wise");
  same(dyq.data, dyq.scale_inv, hdy, Fp8Type::E5M2, "dy row-wise");
  same(dyq.data_t, dyq.scale_inv_t, hdyt, Fp8Type::E5M2, "dy column-wise");
  // 1x128 tiles of the two orientations differ (different elements share a scale).
  EXPECT_NE(xq.scale_inv.to_floats(s), xq.scale_inv_t.to_floats(s));

  auto check = [](const Tensor& got, const std::vector<float>& want, const char* what) {
    const std::vector<float> g = got.to_floats(Stream::cpu());
    ASSERT_EQ(g.size(), want.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      num += (g[i] - want[i]) * static_cast<double>(g[i] - want[i]);
      den += static_cast<double>(want[i]) * want[i];
    }
    // Power-of-2 scales: the dequantized products are exact, only fp32 summation differs.
    EXPECT_LT(std::sqrt(num / den), 1e-5) << what;
  };
  // fprop y [t, out] = x wᵀ: cuBLAS A = w (BLK), B = x (VEC), K = in.
  Tensor y = Tensor::zeros({t, out}, DType::F32, s);
  fp8_gemm(xq, wq, y, {.trans_b = true}, s);
  std::vector<float> ref(static_cast<size_t>(t * out));
  fp8_block_gemm_reference(hw.codes, Fp8Type::E4M3, kBlock, hw.grid, hx.codes, Fp8Type::E4M3, kTile, hx.grid, out, t,
                           in, 1.0f, ref);
  check(y, ref, "fprop");
  // dgrad dx [t, in] = dy w: A = wᵀ (BLK, transposed grid), B = dy (VEC), K = out.
  Tensor dx = Tensor::zeros({t, in}, DType::F32, s);
  fp8_gemm(dyq, wq, dx, {}, s);
  ref.assign(static_cast<size_t>(t * in), 0.0f);
  fp8_block_gemm_reference(hwt.codes, Fp8Type::E4M3, kBlock, hwt.grid, hdy.codes, Fp8Type::E5M2, kTile, hdy.grid, in,
                           t, out, 1.0f, ref);
  check(dx, ref, "dgrad");
  // wgrad dW [out, in] += dyᵀ x: A = xᵀ (VEC along tokens), B = dyᵀ (VEC along tokens), K = t.
  Tensor dw = Tensor::from_floats(std::vector<float>(static_cast<size_t>(out * in), 1.0f), {out, in});
  fp8_gemm(dyq, xq, dw, {.trans_a = true, .beta = 1.0f}, s);
  ref.assign(static_cast<size_t>(out * in), 0.0f);
  fp8_block_gemm_reference(hxt.codes, Fp8Type::E4M3, kTile, hxt.grid, hdyt.codes, Fp8Type::E5M2, kTile, hdyt.grid, in,
                           out, t, 1.0f, ref);
  for (float& v : ref) v += 1.0f;
  check(dw, ref, "wgrad");
  // Refusals: per-tensor x blockwise, 2D x 2D, K not a multiple of 128.
  const Fp8Tensor wq2 = fp8_quantize_blockwise(Tensor::from_floats(wv, {in, out}), Fp8Type::E4M3, kBlock, true, true,
                                               true, s);
  Tensor yy = Tensor::zeros({out, out}, DType::F32, s);
  EXPECT_THROW(fp8_gemm(wq, wq2, yy, {}, s), std::exception);  // 128x128 x 128x128
  const Fp8Tensor odd = fp8_quantize_blockwise(Tensor::from_floats(std::vector<float>(64 * 96, 1.0f), {64, 96}),
                                               Fp8Type::E4M3, kTile, true, true, true, s);
  Tensor oo = Tensor::zeros({64, 64}, DType::F32, s);
  EXPECT_THROW(fp8_gemm(odd, odd, oo, {.trans_b = true}, s), std::exception);
}

// ops::fp8_columnwise on the CPU: a 128x128-block weight cast row-wise only, transposed, gives the
// decoded values and scale grid of the quantizer's own column-wise pass (partial blocks included:
// 200 x 300 is 2 x 3 blocks, the transposed grid's rows padded to 4); per-tensor values serve both
// orientations and come back unchanged; 1x128 tiles, which run along one orientation, are refused.
TEST(Fp8Blockwise, ColumnwiseFromTheRowwiseCodesEqualsTheColumnwiseCast) {
  const Stream& s = Stream::cpu();
  const int64_t rows = 200, cols = 300;
  const Tensor w = Tensor::from_floats(pseudo_random(static_cast<size_t>(rows * cols), 9, 0.05f), {rows, cols});
  const Fp8Tensor both = fp8_quantize_blockwise(w, Fp8Type::E4M3, kBlock, true, true, true, s);
  const Fp8Tensor row = fp8_quantize_blockwise(w, Fp8Type::E4M3, kBlock, true, false, true, s);
  ASSERT_FALSE(row.data_t.defined());
  const Fp8Tensor t = fp8_columnwise(row, s);
  EXPECT_EQ(t.data_t.to_floats(s), both.data_t.to_floats(s));
  EXPECT_EQ(t.scale_inv_t.to_floats(s), both.scale_inv_t.to_floats(s));
  EXPECT_EQ(t.data.data_ptr(), row.data.data_ptr());  // the row-wise codes are shared, not copied

  const Tensor scale = Tensor::from_floats({2.0f}, {1});
  const Fp8Tensor pt = fp8_quantize(w, scale, Fp8Type::E4M3, false, nullptr, s);
  const Fp8Tensor ptt = fp8_columnwise(pt, s);
  EXPECT_EQ(ptt.data.data_ptr(), pt.data.data_ptr());
  EXPECT_FALSE(ptt.data_t.defined());

  const Fp8Tensor tiles = fp8_quantize_blockwise(w, Fp8Type::E4M3, kTile, true, false, true, s);
  EXPECT_THROW(fp8_columnwise(tiles, s), Error);
}
