// RMSNorm / LayerNorm parity: CUDA (bf16 and f32 activations, f32 statistics) against the CPU
// reference on the same bf16-rounded inputs, over row lengths that take every kernel layout (QK-norm
// 64/128 with many rows, 2048, 8192, odd lengths on the single-element path), the accumulation
// contract of dweight/dbias, and bitwise determinism of the two-stage weight-gradient reduction.
#include <gtest/gtest.h>
#include "megadlm/ops/norm.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

struct Shape2 {
  int64_t rows, cols;
};

// rows not a multiple of any block's rows; cols covering warp-per-row (64, 128), several warps per
// row (1000 -> single elements, 2048), the 512-thread layout (8192) and odd lengths.
const Shape2 kShapes[] = {{4099, 2048}, {37, 8192}, {3001, 64}, {2049, 128},
                          {65, 1001},  {17, 3},    {129, 4095}, {300, 8}};

/// Tolerances: y and dx are bf16 outputs (kBf16ParityRelL2); rstd/mean are fp32 statistics of the
/// same inputs and dweight/dbias fp32 sums over rows (kF32AccumRelL2: only summation order and
/// fp32-vs-double accumulation differ). With f32 activations y and dx are fp32 too.
double act_tol(DType dt) { return dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32AccumRelL2; }

void check_rms(const Shape2& s, DType dt) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("rms_norm [", s.rows, ", ", s.cols, "] ", dtype_name(dt));
  const float eps = 1e-5f;
  Input x = make_input({s.rows, s.cols}, dt, gpu, -2.0f, 2.0f);
  Input w = make_input({s.cols}, dt, gpu, 0.5f, 1.5f);
  Tensor y = poisoned({s.rows, s.cols}, dt, gpu), rstd = poisoned({s.rows}, DType::F32, gpu);
  Tensor y_ref = poisoned_host({s.rows, s.cols}), rstd_ref = poisoned_host({s.rows});
  ops::rms_norm_forward(x.device, w.device, y, rstd, eps, gpu);
  ops::rms_norm_forward(x.host, w.host, y_ref, rstd_ref, eps, Stream::cpu());
  expect_close(tag + " y", download(y, gpu), test::to_doubles(y_ref), act_tol(dt));
  expect_close(tag + " rstd", download(rstd, gpu), test::to_doubles(rstd_ref), test::kF32AccumRelL2);

  // Backward from the same saved statistic (the CPU one, uploaded) so that dx and dweight
  // compare the backward alone; dweight starts non-zero to check that it is added to.
  Input dy = make_input({s.rows, s.cols}, dt, gpu);
  Input dw0 = make_input({s.cols}, DType::F32, gpu);
  Tensor rstd_dev = rstd_ref.to(gpu.device(), gpu);
  Tensor dx = poisoned({s.rows, s.cols}, dt, gpu), dx_ref = poisoned_host({s.rows, s.cols});
  Tensor dw = dw0.device, dw_ref = dw0.host;
  ops::rms_norm_backward(dy.device, x.device, w.device, rstd_dev, dx, dw, gpu);
  ops::rms_norm_backward(dy.host, x.host, w.host, rstd_ref, dx_ref, dw_ref, Stream::cpu());
  expect_close(tag + " dx", download(dx, gpu), test::to_doubles(dx_ref), act_tol(dt));
  expect_close(tag + " dweight (+= into random)", download(dw, gpu), test::to_doubles(dw_ref),
               test::kF32AccumRelL2);
}

void check_layer(const Shape2& s, DType dt, bool with_bias) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("layer_norm [", s.rows, ", ", s.cols, "] ", dtype_name(dt),
                                         with_bias ? " bias" : " no-bias");
  const float eps = 1e-5f;
  // An offset mean (values in [1, 3]) exercises the two-pass variance.
  Input x = make_input({s.rows, s.cols}, dt, gpu, 1.0f, 3.0f);
  Input w = make_input({s.cols}, dt, gpu, 0.5f, 1.5f);
  Input b = make_input({s.cols}, dt, gpu);
  Tensor none;
  Tensor y = poisoned({s.rows, s.cols}, dt, gpu), y_ref = poisoned_host({s.rows, s.cols});
  Tensor mean = poisoned({s.rows}, DType::F32, gpu), mean_ref = poisoned_host({s.rows});
  Tensor rstd = poisoned({s.rows}, DType::F32, gpu), rstd_ref = poisoned_host({s.rows});
  ops::layer_norm_forward(x.device, w.device, with_bias ? b.device : none, y, mean, rstd, eps, gpu);
  ops::layer_norm_forward(x.host, w.host, with_bias ? b.host : none, y_ref, mean_ref, rstd_ref, eps,
                          Stream::cpu());
  expect_close(tag + " y", download(y, gpu), test::to_doubles(y_ref), act_tol(dt));
  expect_close(tag + " mean", download(mean, gpu), test::to_doubles(mean_ref), test::kF32AccumRelL2);
  expect_close(tag + " rstd", download(rstd, gpu), test::to_doubles(rstd_ref), test::kF32AccumRelL2);

  Input dy = make_input({s.rows, s.cols}, dt, gpu);
  Input dw0 = make_input({s.cols}, DType::F32, gpu);
  Input db0 = make_input({s.cols}, DType::F32, gpu);
  Tensor mean_dev = mean_ref.to(gpu.device(), gpu), rstd_dev = rstd_ref.to(gpu.device(), gpu);
  Tensor dx = poisoned({s.rows, s.cols}, dt, gpu), dx_ref = poisoned_host({s.rows, s.cols});
  Tensor dw = dw0.device, dw_ref = dw0.host;
  Tensor db = with_bias ? db0.device : none, db_ref = with_bias ? db0.host : none;
  ops::layer_norm_backward(dy.device, x.device, w.device, mean_dev, rstd_dev, dx, dw, db, gpu);
  ops::layer_norm_backward(dy.host, x.host, w.host, mean_ref, rstd_ref, dx_ref, dw_ref, db_ref,
                           Stream::cpu());
  expect_close(tag + " dx", download(dx, gpu), test::to_doubles(dx_ref), act_tol(dt));
  expect_close(tag + " dweight (+= into random)", download(dw, gpu), test::to_doubles(dw_ref),
               test::kF32AccumRelL2);
  if (with_bias)
    expect_close(tag + " dbias (+= into random)", download(db, gpu), test::to_doubles(db_ref),
                 test::kF32AccumRelL2);
}

}  // namespace

TEST(RmsNormParity, MatchesCpuForwardAndBackwardOnEveryRowLayout) {
  MDLM_REQUIRE_GPU();
  for (const Shape2& s : kShapes) check_rms(s, DType::BF16);
  check_rms({513, 2048}, DType::F32);
  check_rms({77, 1001}, DType::F32);
}

TEST(LayerNormParity, MatchesCpuForwardAndBackwardOnEveryRowLayout) {
  MDLM_REQUIRE_GPU();
  for (const Shape2& s : kShapes) check_layer(s, DType::BF16, true);
  check_layer({1025, 2048}, DType::BF16, false);
  check_layer({129, 4095}, DType::BF16, false);
  check_layer({513, 2048}, DType::F32, true);
}

TEST(NormParity, WeightGradientsAreBitwiseReproducible) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (const Shape2& s : {Shape2{8192, 2048}, Shape2{131072, 128}}) {
    Input x = make_input({s.rows, s.cols}, DType::BF16, gpu);
    Input dy = make_input({s.rows, s.cols}, DType::BF16, gpu);
    Input w = make_input({s.cols}, DType::BF16, gpu);
    Input mean = make_input({s.rows}, DType::F32, gpu, -0.1f, 0.1f);
    Input rstd = make_input({s.rows}, DType::F32, gpu, 0.5f, 2.0f);
    std::vector<double> runs[2][2];
    for (int r = 0; r < 2; ++r) {
      Tensor dx = poisoned({s.rows, s.cols}, DType::BF16, gpu);
      Tensor dw = Tensor::zeros({s.cols}, DType::F32, gpu), db = Tensor::zeros({s.cols}, DType::F32, gpu);
      ops::rms_norm_backward(dy.device, x.device, w.device, rstd.device, dx, dw, gpu);
      runs[r][0] = download(dw, gpu);
      Tensor dw2 = Tensor::zeros({s.cols}, DType::F32, gpu);
      ops::layer_norm_backward(dy.device, x.device, w.device, mean.device, rstd.device, dx, dw2, db,
                               gpu);
      runs[r][1] = download(db, gpu);
    }
    const std::string tag = detail::concat("norm backward [", s.rows, ", ", s.cols, "]");
    expect_identical(tag + " rms dweight, two runs", runs[0][0], runs[1][0]);
    expect_identical(tag + " layer dbias, two runs", runs[0][1], runs[1][1]);
  }
}
