// FP8 GEMM rows of `megadlm_bench ops`: the 1.7B model's linear GEMMs (forward, data gradient,
// weight gradient) through the cuBLASLt FP8 GEMM in the TN layout Hopper requires, plus an 8192^3
// product for the FP8 peak. Each row is first checked against the CPU emulation
// (ops::fp8_gemm_reference) on a small product with the same formats and output dtype.
// Timed: the GEMM alone, on codes already quantized (quantization is a separate kernel). The
// percentage column is of the bf16 ceiling like every matrix row, so FP8 rows can exceed 100 %.
// Blockwise rows (fp8_gemm_blk_*, --fp8-recipe blockwise): the same GEMMs with cuBLASLt's block
// scale modes, fprop and dgrad BLK128x128 (weight) x VEC128, wgrad VEC128 x VEC128, and the
// block quantizers (fp8_quant_blk_*: an activation's two 1x128 tilings, a weight's 128x128
// blocks in both orientations), checked against the host reference first.
// These rows call the internal CUDA entry points (src/ops/cuda/fp8_cuda.h) because megadlm has
// no FP8 tensor dtype for a public ops:: call yet.
#include <cstring>
#include <string>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/ops/fp8.h"
#include "megadlm_bench/bench.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/fp8_cuda.h"
#endif

namespace megadlm::bench {

#if MEGADLM_WITH_CUDA
namespace {

// cuBLASLt FP8 (fp32 D) vs the CPU emulation on the same codes: only accumulation differs
// (tests/support/tolerances.h, kFp8GemmF32RelL2).
constexpr double kTolFp8F32 = 1e-3;

struct Fp8Shape {
  std::string name;
  int64_t m, n, k;         // d[n, m] = a[m, k] · b[n, k]ᵀ
  ops::Fp8Type type_b;     // hybrid: gradients (dgrad's and wgrad's b) in e5m2
  DType out;
  ops::Fp8Granularity ga = ops::Fp8Granularity::Tensor;  // blockwise: a's and b's scale granularity
  ops::Fp8Granularity gb = ops::Fp8Granularity::Tensor;
};

/// Host codes in a device buffer (an i32 tensor: there is no byte dtype yet).
Tensor device_codes(const std::vector<uint8_t>& codes, const Stream& s) {
  std::vector<int32_t> words((codes.size() + 3) / 4, 0);
  std::memcpy(words.data(), codes.data(), codes.size());
  return device_ints(words, s);
}

/// Device codes of random values quantized on the device with their current scale.
Tensor random_codes(int64_t rows, int64_t cols, ops::Fp8Type type, const Stream& s) {
  Tensor x = random_device({rows, cols}, DType::BF16, s);
  Tensor codes = Tensor::empty({(rows * cols + 3) / 4}, DType::I32, s);
  Tensor scale = Tensor::from_floats({ops::fp8_max(type)}, {1}).to(s.device(), s);
  Tensor amax = Tensor::from_floats({0.0f}, {1}).to(s.device(), s);
  ops::cuda::fp8_quantize(x, static_cast<const float*>(scale.data_ptr()), type,
                          static_cast<uint8_t*>(codes.data_ptr()), nullptr,
                          static_cast<float*>(amax.data_ptr()), s);
  return codes;
}

const char* type_name(ops::Fp8Type t) { return t == ops::Fp8Type::E4M3 ? "e4m3" : "e5m2"; }
const char* mode_name(ops::Fp8Granularity g) {
  return g == ops::Fp8Granularity::Tile1x128 ? "VEC128" : g == ops::Fp8Granularity::Block128x128 ? "BLK128" : "";
}

/// Blockwise: device codes and scale grid of random bf16 values quantized on the device.
struct BlockCodes {
  Tensor codes, grid;
};
BlockCodes random_block_codes(int64_t rows, int64_t cols, ops::Fp8Type type, ops::Fp8Granularity g, const Stream& s) {
  Tensor x = random_device({rows, cols}, DType::BF16, s);
  const ops::Fp8Tensor q = ops::cuda::fp8_quantize_blockwise_tensor(x, type, g, true, false, true, s);
  return {q.data, q.scale_inv};
}

OpBench fp8_block_gemm_bench(const Fp8Shape& g) {
  OpBench b;
  b.name = "fp8_gemm_blk_" + g.name;
  b.shape = detail::concat(g.m, "x", g.n, "x", g.k, " ", mode_name(g.ga), "x", mode_name(g.gb), " e4m3x",
                           type_name(g.type_b), "->", dtype_name(g.out));
  b.flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  b.check = [g](const Stream& s) {
    const int64_t m = 256, n = 384, k = 512;
    const std::vector<float> a = bf16_values(m * k, -0.1f, 0.1f), bb = bf16_values(n * k, -2.0f, 2.0f);
    std::vector<uint8_t> qa(a.size()), qb(bb.size());
    std::vector<float> sa(static_cast<size_t>(ops::fp8_block_grid_size(g.ga, m, k)));
    std::vector<float> sb(static_cast<size_t>(ops::fp8_block_grid_size(g.gb, n, k)));
    ops::fp8_quantize_blockwise(a, m, k, g.ga, ops::Fp8Type::E4M3, true, qa, sa);
    ops::fp8_quantize_blockwise(bb, n, k, g.gb, g.type_b, true, qb, sb);
    Tensor qa_d = device_codes(qa, s), qb_d = device_codes(qb, s);
    Tensor sa_d = Tensor::from_floats(sa, {static_cast<int64_t>(sa.size())}).to(s.device(), s);
    Tensor sb_d = Tensor::from_floats(sb, {static_cast<int64_t>(sb.size())}).to(s.device(), s);
    Tensor d = Tensor::empty({n, m}, g.out, s);
    ops::cuda::fp8_gemm(static_cast<const uint8_t*>(qa_d.data_ptr()), ops::Fp8Type::E4M3, sa_d.data<float>(),
                        static_cast<const uint8_t*>(qb_d.data_ptr()), g.type_b, sb_d.data<float>(), m, n, k, 1.0f, d,
                        s, 0.0f, g.ga, g.gb);
    std::vector<float> ref(static_cast<size_t>(m * n));
    ops::fp8_block_gemm_reference(qa, ops::Fp8Type::E4M3, g.ga, sa, qb, g.type_b, g.gb, sb, m, n, k, 1.0f, ref);
    Check r;
    r.add(rel_err(d, Tensor::from_floats(ref, {n, m}), s), g.out == DType::BF16 ? kTolBf16 : kTolFp8F32);
    return r;
  };
  b.setup = [g](const Stream& s) -> std::function<void()> {
    const BlockCodes a = random_block_codes(g.m, g.k, ops::Fp8Type::E4M3, g.ga, s);
    const BlockCodes bb = random_block_codes(g.n, g.k, g.type_b, g.gb, s);
    Tensor d = Tensor::empty({g.n, g.m}, g.out, s);
    return [a, bb, d, g, &s]() mutable {
      ops::cuda::fp8_gemm(static_cast<const uint8_t*>(a.codes.data_ptr()), ops::Fp8Type::E4M3, a.grid.data<float>(),
                          static_cast<const uint8_t*>(bb.codes.data_ptr()), g.type_b, bb.grid.data<float>(), g.m, g.n,
                          g.k, 1.0f, d, s, 0.0f, g.ga, g.gb);
    };
  };
  return b;
}

/// The block quantizer on a bf16 [rows, cols] tensor: both orientations (an activation's
/// row-wise and column-wise 1x128 tilings, or a weight's 128x128 blocks and their transpose),
/// checked bit for bit against the host reference on a small ragged case.
OpBench fp8_block_quantize_bench(const std::string& name, int64_t rows, int64_t cols, ops::Fp8Granularity g) {
  OpBench b;
  b.name = "fp8_quant_blk_" + name;
  b.shape = detail::concat(rows, "x", cols, " bf16 ", mode_name(g), " both orientations");
  // Two bf16 reads (two tilings, or amax then cast) and two code writes per element.
  b.bytes = static_cast<double>(rows * cols) * 6.0;
  b.check = [g](const Stream& s) {
    const int64_t rows = 200, cols = 384;
    const std::vector<float> x = bf16_values(rows * cols, -3.0f, 3.0f);
    Tensor xd = Tensor::from_floats(x, {rows, cols}, DType::BF16).to(s.device(), s);
    const ops::Fp8Tensor q = ops::cuda::fp8_quantize_blockwise_tensor(xd, ops::Fp8Type::E4M3, g, true, false, true, s);
    std::vector<uint8_t> want(x.size());
    std::vector<float> grid(static_cast<size_t>(ops::fp8_block_grid_size(g, rows, cols)));
    ops::fp8_quantize_blockwise(x, rows, cols, g, ops::Fp8Type::E4M3, true, want, grid);
    const std::vector<int32_t> words = q.data.to_ints(s);
    std::vector<uint8_t> got(want.size());
    std::memcpy(got.data(), words.data(), got.size());
    Check r;
    r.add(got == want && q.scale_inv.to_floats(s) == grid ? 0.0 : 1.0, 0.5);  // bit for bit or fail
    return r;
  };
  b.setup = [rows, cols, g](const Stream& s) -> std::function<void()> {
    Tensor x = random_device({rows, cols}, DType::BF16, s);
    return [x, g, &s]() { (void)ops::cuda::fp8_quantize_blockwise_tensor(x, ops::Fp8Type::E4M3, g, true, true, true, s); };
  };
  return b;
}

/// The per-tensor quantizer (delayed / tensorwise) on a bf16 [rows, cols] tensor with its amax:
/// row-wise codes only (an activation in the forward) or both orientations in one pass (a
/// gradient, or x for the weight gradient), checked bit for bit against the host reference.
/// ops::cuda::fp8_quantize on tensors holding the scale, the amax and the codes (bytes in i32
/// tensors); codes_t null: row-wise codes only.
void quantize_into(const Tensor& x, const Tensor& scale, const Tensor& amax, const Tensor& codes,
                   const Tensor* codes_t, const Stream& s) {
  ops::cuda::fp8_quantize(x, static_cast<const float*>(scale.data_ptr()), ops::Fp8Type::E4M3,
                          static_cast<uint8_t*>(codes.data_ptr()),
                          codes_t != nullptr ? static_cast<uint8_t*>(codes_t->data_ptr()) : nullptr,
                          static_cast<float*>(amax.data_ptr()), s);
}

OpBench fp8_quantize_bench(const std::string& name, int64_t rows, int64_t cols, bool columnwise) {
  OpBench b;
  b.name = "fp8_quant_" + name;
  b.shape = detail::concat(rows, "x", cols, " bf16 per-tensor ", columnwise ? "both orientations" : "row-wise");
  b.bytes = static_cast<double>(rows * cols) * (columnwise ? 4.0 : 3.0);  // 2 read, 1 written per orientation
  b.check = [columnwise](const Stream& s) {
    const int64_t rows = 192, cols = 320;
    const std::vector<float> x = bf16_values(rows * cols, -3.0f, 3.0f);
    const float scale = 37.0f;
    std::vector<uint8_t> want(x.size());
    ops::fp8_quantize(x, scale, ops::Fp8Type::E4M3, want);
    Tensor xd = Tensor::from_floats(x, {rows, cols}, DType::BF16).to(s.device(), s);
    Tensor scale_d = Tensor::from_floats({scale}, {1}).to(s.device(), s);
    Tensor amax = Tensor::from_floats({0.0f}, {1}).to(s.device(), s);
    Tensor codes = Tensor::empty({rows * cols / 4}, DType::I32, s), codes_t = Tensor::empty({rows * cols / 4}, DType::I32, s);
    quantize_into(xd, scale_d, amax, codes, columnwise ? &codes_t : nullptr, s);
    std::vector<uint8_t> got(want.size());
    const std::vector<int32_t> words = codes.to_ints(s);
    std::memcpy(got.data(), words.data(), got.size());
    bool same = got == want;
    if (columnwise) {
      const std::vector<int32_t> words_t = codes_t.to_ints(s);
      const auto* t = reinterpret_cast<const uint8_t*>(words_t.data());
      for (int64_t r = 0; r < rows && same; ++r)
        for (int64_t c = 0; c < cols; ++c) same = same && t[c * rows + r] == want[r * cols + c];
    }
    Check r;
    r.add(same ? 0.0 : 1.0, 0.5);  // bit for bit or fail
    return r;
  };
  b.setup = [rows, cols, columnwise](const Stream& s) -> std::function<void()> {
    Tensor x = random_device({rows, cols}, DType::BF16, s);
    Tensor scale = Tensor::from_floats({100.0f}, {1}).to(s.device(), s);
    Tensor amax = Tensor::from_floats({0.0f}, {1}).to(s.device(), s);
    Tensor codes = Tensor::empty({rows * cols / 4}, DType::I32, s), codes_t = Tensor::empty({rows * cols / 4}, DType::I32, s);
    return [x, scale, amax, codes, codes_t, columnwise, &s]() {
      quantize_into(x, scale, amax, codes, columnwise ? &codes_t : nullptr, s);
    };
  };
  return b;
}

OpBench fp8_gemm_bench(const Fp8Shape& g) {
  OpBench b;
  b.name = "fp8_gemm_" + g.name;
  b.shape = detail::concat(g.m, "x", g.n, "x", g.k, " TN e4m3x", type_name(g.type_b), "->",
                           dtype_name(g.out));
  b.flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  b.check = [g](const Stream& s) {
    const int64_t m = 192, n = 320, k = 256;
    const std::vector<float> a = bf16_values(m * k, -0.1f, 0.1f), bb = bf16_values(n * k, -2.0f, 2.0f);
    const float sa = ops::fp8_current_scale(ops::fp8_amax(a), ops::fp8_max(ops::Fp8Type::E4M3));
    const float sb = ops::fp8_current_scale(ops::fp8_amax(bb), ops::fp8_max(g.type_b));
    std::vector<uint8_t> qa(a.size()), qb(bb.size());
    ops::fp8_quantize(a, sa, ops::Fp8Type::E4M3, qa);
    ops::fp8_quantize(bb, sb, g.type_b, qb);
    Tensor qa_d = device_codes(qa, s), qb_d = device_codes(qb, s);
    // One tensor per scale: cuBLASLt refuses scale pointers that are not 16-byte aligned.
    Tensor inv_a = Tensor::from_floats({1.0f / sa}, {1}).to(s.device(), s);
    Tensor inv_b = Tensor::from_floats({1.0f / sb}, {1}).to(s.device(), s);
    Tensor d = Tensor::empty({n, m}, g.out, s);
    ops::cuda::fp8_gemm(static_cast<const uint8_t*>(qa_d.data_ptr()), ops::Fp8Type::E4M3, inv_a.data<float>(),
                        static_cast<const uint8_t*>(qb_d.data_ptr()), g.type_b, inv_b.data<float>(), m, n, k,
                        1.0f, d, s);
    std::vector<float> ref(static_cast<size_t>(m * n));
    ops::fp8_gemm_reference(qa, ops::Fp8Type::E4M3, 1.0f / sa, qb, g.type_b, 1.0f / sb, m, n, k, 1.0f, ref);
    Check r;
    r.add(rel_err(d, Tensor::from_floats(ref, {n, m}), s), g.out == DType::BF16 ? kTolBf16 : kTolFp8F32);
    return r;
  };
  b.setup = [g](const Stream& s) -> std::function<void()> {
    Tensor a = random_codes(g.m, g.k, ops::Fp8Type::E4M3, s);
    Tensor bb = random_codes(g.n, g.k, g.type_b, s);
    Tensor inv_a = Tensor::from_floats({1.0f}, {1}).to(s.device(), s);
    Tensor inv_b = Tensor::from_floats({1.0f}, {1}).to(s.device(), s);
    Tensor d = Tensor::empty({g.n, g.m}, g.out, s);
    return [a, bb, inv_a, inv_b, d, g, &s]() mutable {
      ops::cuda::fp8_gemm(static_cast<const uint8_t*>(a.data_ptr()), ops::Fp8Type::E4M3, inv_a.data<float>(),
                          static_cast<const uint8_t*>(bb.data_ptr()), g.type_b, inv_b.data<float>(), g.m, g.n,
                          g.k, 1.0f, d, s);
    };
  };
  return b;
}

}  // namespace
#endif

std::vector<OpBench> fp8_benches() {
  std::vector<OpBench> out;
#if MEGADLM_WITH_CUDA
  const int64_t T = kTokens, H = kHidden, QKV = 3 * kHidden, F1 = 2 * kFfn, F2 = kFfn;
  using ops::Fp8Type;
  // Linear [out, in], y = x wᵀ. fprop: a = w [out, in], b = x [T, in]; dgrad: a = wᵀ [in, out],
  // b = dy [T, out]; wgrad: a = xᵀ [in, T], b = dyᵀ [out, T], d = dw [out, in] in fp32.
  struct Linear { const char* name; int64_t out, in; };
  const Linear linears[] = {{"qkv", QKV, H}, {"proj", H, H}, {"fc1", F1, H}, {"fc2", H, F2}};
  for (const Linear& l : linears) {
    const std::string n = l.name;
    out.push_back(fp8_gemm_bench({n + "_fwd", l.out, T, l.in, Fp8Type::E4M3, DType::BF16}));
    out.push_back(fp8_gemm_bench({n + "_dgrad", l.in, T, l.out, Fp8Type::E5M2, DType::BF16}));
    out.push_back(fp8_gemm_bench({n + "_wgrad", l.in, l.out, T, Fp8Type::E5M2, DType::F32}));
  }
  out.push_back(fp8_gemm_bench({"square_8192", 8192, 8192, 8192, Fp8Type::E4M3, DType::BF16}));
  // --fp8-recipe blockwise: the same GEMMs with block scales (fprop / dgrad BLK128x128 x VEC128,
  // wgrad VEC128 x VEC128), then the quantizers of one layer's operands.
  using G = ops::Fp8Granularity;
  for (const Linear& l : linears) {
    const std::string n = l.name;
    out.push_back(fp8_block_gemm_bench({n + "_fwd", l.out, T, l.in, Fp8Type::E4M3, DType::BF16, G::Block128x128, G::Tile1x128}));
    out.push_back(fp8_block_gemm_bench({n + "_dgrad", l.in, T, l.out, Fp8Type::E5M2, DType::BF16, G::Block128x128, G::Tile1x128}));
    out.push_back(fp8_block_gemm_bench({n + "_wgrad", l.in, l.out, T, Fp8Type::E5M2, DType::F32, G::Tile1x128, G::Tile1x128}));
  }
  out.push_back(fp8_block_gemm_bench({"square_8192", 8192, 8192, 8192, Fp8Type::E4M3, DType::BF16, G::Block128x128, G::Tile1x128}));
  // The per-tensor quantizers of one layer's largest operands: x of fc1 (row-wise, forward) and
  // dy of fc1 (both orientations, backward).
  out.push_back(fp8_quantize_bench("x_" + std::to_string(T) + "x" + std::to_string(H), T, H, false));
  out.push_back(fp8_quantize_bench("t_dy_" + std::to_string(T) + "x" + std::to_string(F1), T, F1, true));
  out.push_back(fp8_block_quantize_bench("x_" + std::to_string(T) + "x" + std::to_string(H), T, H, G::Tile1x128));
  out.push_back(fp8_block_quantize_bench("fc1_w", F1, H, G::Block128x128));
#endif
  return out;
}

}  // namespace megadlm::bench
