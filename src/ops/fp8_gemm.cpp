// FP8 tensors and GEMM on Tensors (include/megadlm/ops/fp8_gemm.h): the dispatch, the shared
// checks, and the CPU backend, which emulates the device with the exact host numerics of
// ops/fp8.h (codes decoded to f32, the GEMM of the decoded values scaled once by both inverse
// scales, as cuBLASLt applies its A/B scale pointers).
#include "megadlm/ops/fp8_gemm.h"
#include <cmath>
#include <vector>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/fp8.h"
#include "ops/dispatch.h"
#include "ops/fp8_math.h"
#if MEGADLM_WITH_CUDA
#include "ops/cuda/fp8_cuda.h"
#endif

namespace megadlm::ops {

namespace {
fp8_math::Format format_of(Fp8Type type) {
  return type == Fp8Type::E4M3 ? fp8_math::e4m3() : fp8_math::e5m2();
}
// CPU blockwise: the f32 decoded codes [rows, k] times each element's tile scale_inv (the
// dequantized operand), from the codes and grid of one orientation.
Tensor dequantize_blockwise(const Tensor& codes, const Tensor& grid, Fp8Granularity g, const Stream& stream) {
  const int64_t rows = codes.rows(), k = codes.cols();
  MDLM_CHECK(grid.defined() && grid.numel() == fp8_block_grid_size(g, rows, k), "fp8_gemm (CPU): scale grid of ",
             grid.defined() ? grid.numel() : 0, " floats for [", rows, ", ", k, "] codes");
  Tensor out = Tensor::empty({rows, k}, DType::F32, stream);
  const float* q = codes.data<float>();
  const float* s = grid.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) o[r * k + c] = q[r * k + c] * s[fp8_block_grid_index(g, rows, k, r, c)];
  return out;
}

// x [rows, cols] f32 (contiguous, CPU) quantized blockwise along cols: f32 decoded codes + grid.
void quantize_blockwise_host(const float* x, int64_t rows, int64_t cols, Fp8Granularity g, Fp8Type type,
                             bool power_of_2, Tensor& data, Tensor& grid, const Stream& stream) {
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<uint8_t> codes(n);
  grid = Tensor::empty({fp8_block_grid_size(g, rows, cols)}, DType::F32, stream);
  fp8_quantize_blockwise({x, n}, rows, cols, g, type, power_of_2, codes,
                         {grid.data<float>(), static_cast<size_t>(grid.numel())});
  data = Tensor::empty({rows, cols}, DType::F32, stream);
  const fp8_math::Format f = format_of(type);
  float* d = data.data<float>();
  for (size_t i = 0; i < n; ++i) d[i] = fp8_math::decode(codes[i], f);
}

// out [cols, rows] = the transpose of x [rows, cols] (CPU, contiguous).
void transpose_host(const float* x, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * cols + c];
}

float host_scalar(const Tensor& t, const char* op, const char* what) {
  MDLM_CHECK(t.defined() && t.numel() >= 1 && t.dtype() == DType::F32, op, ": ", what,
             " must be an f32 scalar tensor, got ", t.defined() ? t.str() : std::string("undefined"));
  return t.data<float>()[0];
}
}  // namespace

void fp8_amax(const Tensor& x, Tensor& amax, const Stream& stream) {
  detail::check_device("fp8_amax", stream, {&x, &amax});
  detail::check_dtype("fp8_amax", amax, DType::F32, "amax");
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(cuda::fp8_amax(x, amax.data<float>(), stream));
    return;
  }
  detail::check_dtype("fp8_amax", x, DType::F32, "x (CPU)");
  float m = amax.data<float>()[0];
  const float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float a = std::fabs(p[i]);
    if (a > m) m = a;  // NaN never compares greater: ignored
  }
  amax.data<float>()[0] = m;
}

void fp8_scale_from_amax(const Tensor& amax, Tensor& scale, Fp8Type type, const Stream& stream) {
  detail::check_device("fp8_scale_from_amax", stream, {&amax, &scale});
  detail::check_dtype("fp8_scale_from_amax", amax, DType::F32, "amax");
  detail::check_dtype("fp8_scale_from_amax", scale, DType::F32, "scale");
  detail::check_numel("fp8_scale_from_amax", scale, amax.numel(), "scale");
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(cuda::fp8_scale_from_amax(amax.data<float>(), scale.data<float>(), amax.numel(),
                                                fp8_max(type), stream));
    return;
  }
  for (int64_t i = 0; i < amax.numel(); ++i)
    scale.data<float>()[i] = fp8_current_scale(amax.data<float>()[i], fp8_max(type));
}

Fp8Tensor fp8_quantize(const Tensor& x, const Tensor& scale, Fp8Type type, bool columnwise,
                       Tensor* amax, const Stream& stream, bool rowwise) {
  detail::check_device("fp8_quantize", stream, {&x, &scale, amax});
  detail::check_dtype("fp8_quantize", scale, DType::F32, "scale");
  if (amax != nullptr) detail::check_dtype("fp8_quantize", *amax, DType::F32, "amax");
  Fp8Tensor q;
  q.type = type;
  q.rows = x.rows();
  q.cols = x.cols();
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(q = cuda::fp8_quantize_tensor(x, scale, type, columnwise || !rowwise, amax, stream, rowwise));
    return q;
  }
  detail::check_dtype("fp8_quantize", x, DType::F32, "x (CPU)");
  const float s = host_scalar(scale, "fp8_quantize", "scale");
  const fp8_math::Format f = format_of(type);
  q.data = Tensor::empty({q.rows, q.cols}, DType::F32, stream);
  const float* px = x.data<float>();
  float* pq = q.data.data<float>();
  float m = amax != nullptr ? amax->data<float>()[0] : 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = px[i];
    const float a = std::fabs(v);
    if (a > m) m = a;
    pq[i] = fp8_math::decode(fp8_math::encode(v * s, f), f);  // v·s rounded to fp32 first
  }
  if (amax != nullptr) amax->data<float>()[0] = m;
  q.scale_inv = Tensor::from_floats({1.0f / s}, {1});
  return q;
}

Fp8Tensor fp8_quantize_blockwise(const Tensor& x, Fp8Type type, Fp8Granularity granularity,
                                 bool rowwise, bool columnwise, bool power_of_2, const Stream& stream) {
  detail::check_device("fp8_quantize_blockwise", stream, {&x});
  MDLM_CHECK(granularity != Fp8Granularity::Tensor,
             "fp8_quantize_blockwise: granularity must be Tile1x128 or Block128x128");
  MDLM_CHECK(rowwise || columnwise, "fp8_quantize_blockwise: asks for neither orientation");
  Fp8Tensor q;
  q.type = type;
  q.granularity = granularity;
  q.rows = x.rows();
  q.cols = x.cols();
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(q = cuda::fp8_quantize_blockwise_tensor(x, type, granularity, rowwise, columnwise,
                                                              power_of_2, stream));
    return q;
  }
  detail::check_dtype("fp8_quantize_blockwise", x, DType::F32, "x (CPU)");
  const Tensor& xc = x;
  if (rowwise)
    quantize_blockwise_host(xc.data<float>(), q.rows, q.cols, granularity, type, power_of_2, q.data, q.scale_inv,
                            stream);
  if (columnwise) {
    std::vector<float> xt(static_cast<size_t>(q.rows * q.cols));
    transpose_host(xc.data<float>(), q.rows, q.cols, xt.data());
    quantize_blockwise_host(xt.data(), q.cols, q.rows, granularity, type, power_of_2, q.data_t, q.scale_inv_t,
                            stream);
  }
  return q;
}

Fp8Tensor fp8_columnwise(const Fp8Tensor& q, const Stream& stream) {
  detail::check_device("fp8_columnwise", stream, {&q.data, &q.scale_inv});
  MDLM_CHECK(q.data.defined(), "fp8_columnwise: the row-wise codes are missing");
  MDLM_CHECK(q.granularity != Fp8Granularity::Tile1x128,
             "fp8_columnwise: 1x128 tiles run along one orientation; quantize the other from x");
  if (q.data_t.defined()) return q;
  if (stream.is_cuda()) {
    Fp8Tensor t;
    MDLM_CUDA_BACKEND(t = cuda::fp8_columnwise_tensor(q, stream));
    return t;
  }
  if (!q.blockwise()) return q;  // the CPU's per-tensor values serve both orientations
  Fp8Tensor t = q;
  t.data_t = Tensor::empty({q.cols, q.rows}, DType::F32, stream);
  transpose_host(q.data.data<float>(), q.rows, q.cols, t.data_t.data<float>());
  // Block (rb, cb) of [rows, cols] is block (cb, rb) of [cols, rows]; the padding stays zero.
  const Fp8Granularity g = q.granularity;
  t.scale_inv_t = Tensor::zeros({fp8_block_grid_size(g, q.cols, q.rows)}, DType::F32, stream);
  const float* grid = q.scale_inv.data<float>();
  float* grid_t = t.scale_inv_t.data<float>();
  for (int64_t r = 0; r < q.rows; r += kFp8BlockSize)
    for (int64_t c = 0; c < q.cols; c += kFp8BlockSize)
      grid_t[fp8_block_grid_index(g, q.cols, q.rows, c, r)] = grid[fp8_block_grid_index(g, q.rows, q.cols, r, c)];
  return t;
}

void fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, Tensor& c, const GemmArgs& args,
              const Stream& stream) {
  MDLM_CHECK(a.defined() && b.defined(), "fp8_gemm: undefined operand");
  MDLM_CHECK(!(a.type == Fp8Type::E5M2 && b.type == Fp8Type::E5M2),
             "fp8_gemm: e5m2 x e5m2 has no Hopper GEMM; one operand must be e4m3");
  const int64_t m = args.trans_a ? a.cols : a.rows, k = args.trans_a ? a.rows : a.cols;
  const int64_t kb = args.trans_b ? b.cols : b.rows, n = args.trans_b ? b.rows : b.cols;
  MDLM_CHECK(k == kb, "fp8_gemm: inner dimensions differ: op(A) [", m, ", ", k, "], op(B) [", kb,
             ", ", n, "]");
  MDLM_CHECK(c.rows() == m && c.cols() == n, "fp8_gemm: C ", c.str(), " must be [", m, ", ", n, "]");
  detail::check_device("fp8_gemm", stream, {&c, args.bias, args.addend});
  if (args.addend != nullptr) detail::check_addend("fp8_gemm", *args.addend, c, m, n);
  if (stream.is_cuda()) {
    MDLM_CUDA_BACKEND(cuda::fp8_gemm_tensor(a, b, c, args, stream));
    return;
  }
  MDLM_CHECK(a.blockwise() == b.blockwise(), "fp8_gemm: both operands per-tensor scaled, or both blockwise");
  if (a.blockwise()) {
    MDLM_CHECK(!(a.granularity == Fp8Granularity::Block128x128 && b.granularity == Fp8Granularity::Block128x128),
               "fp8_gemm: 128x128 x 128x128 block scaling has no cuBLASLt mode; one operand must be 1x128");
    MDLM_CHECK(k % kFp8BlockSize == 0, "fp8_gemm: blockwise scaling needs K % 128 == 0, got K=", k);
    // The operands the device reads, K contiguous: op(A) [M, K], op(B) [N, K].
    const Tensor& qa = args.trans_a ? a.data_t : a.data;
    const Tensor& sa = args.trans_a ? a.scale_inv_t : a.scale_inv;
    const Tensor& qb = args.trans_b ? b.data : b.data_t;
    const Tensor& sb = args.trans_b ? b.scale_inv : b.scale_inv_t;
    MDLM_CHECK(qa.defined() && qb.defined(), "fp8_gemm (CPU, blockwise): op(A) needs the ",
               args.trans_a ? "column" : "row", "-wise codes of A, op(B) the ", args.trans_b ? "row" : "column",
               "-wise codes of B (tiles along K)");
    const Tensor da = dequantize_blockwise(qa, sa, a.granularity, stream);
    const Tensor db = dequantize_blockwise(qb, sb, b.granularity, stream);
    GemmArgs tn = args;
    tn.trans_a = false;
    tn.trans_b = true;
    gemm(da, db, c, tn, stream);
    return;
  }
  MDLM_CHECK(a.data.defined() && b.data.defined(), "fp8_gemm (CPU): operands need row-wise data");
  GemmArgs scaled = args;
  scaled.alpha = args.alpha * host_scalar(a.scale_inv, "fp8_gemm", "scale_inv of A") *
                 host_scalar(b.scale_inv, "fp8_gemm", "scale_inv of B");
  gemm(a.data, b.data, c, scaled, stream);
}

void fp8_swiglu_backward(const Tensor& dact, const Tensor& fc1_out, const Fp8CastTarget& dfc1_target,
                         const Fp8CastTarget& act_target, Fp8Tensor& dfc1, Fp8Tensor& act, const Stream& stream) {
  const char* op = "fp8_swiglu_backward";
  detail::check_device(op, stream, {&dact, &fc1_out, &dfc1_target.scale, &dfc1_target.amax, &act_target.scale,
                                    &act_target.amax});
  MDLM_CHECK(dact.dim() == 2 && fc1_out.dim() == 2 && fc1_out.rows() == dact.rows() &&
                 fc1_out.cols() == 2 * dact.cols() && fc1_out.dtype() == dact.dtype(),
             op, ": fc1_out ", fc1_out.str(), " must be [rows, 2 f] of dact ", dact.str(), "'s dtype");
  for (const Tensor* t : {&dfc1_target.scale, &dfc1_target.amax, &act_target.scale, &act_target.amax})
    detail::check_dtype(op, *t, DType::F32, "scale / amax");
#if MEGADLM_WITH_CUDA
  if (stream.is_cuda() && cuda::fp8_swiglu_backward_fused(dact, fc1_out, dfc1_target, act_target, dfc1, act, stream))
    return;
#endif
  // The definition: the bf16 (or f32) outputs, then their casts.
  Tensor dx = Tensor::empty(fc1_out.shape(), dact.dtype(), stream);
  Tensor y = Tensor::empty(dact.shape(), dact.dtype(), stream);
  swiglu_backward_recompute(dact, fc1_out, dx, y, stream);
  Tensor dfc1_amax = dfc1_target.amax, act_amax = act_target.amax;
  dfc1 = fp8_quantize(dx, dfc1_target.scale, dfc1_target.type, /*columnwise=*/true, &dfc1_amax, stream);
  act = fp8_quantize(y, act_target.scale, act_target.type, /*columnwise=*/true, &act_amax, stream,
                     /*rowwise=*/false);
}

}  // namespace megadlm::ops
