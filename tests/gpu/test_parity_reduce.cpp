// Reduction parity: sum_squares (bf16, f32, f16 inputs), sum_rows (bias gradients) and dot on CUDA
// against the CPU reference (which sums in double), the accumulate-into-output contract, and
// bitwise reproducibility of the two-stage reductions.
#include <gtest/gtest.h>
#include "megadlm/ops/reduce.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

// All outputs are fp32 sums of the same inputs: CUDA sums fp32 partials in a fixed tree, the CPU
// in double, so only summation order and precision differ: kF32AccumRelL2.

TEST(ReduceParity, SumSquaresAccumulatesIntoItsOutput) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (DType dt : {DType::BF16, DType::F32, DType::F16}) {
    for (int64_t n : {int64_t{20'000'003}, int64_t{1000003}, int64_t{7}}) {
      const std::string tag = detail::concat("sum_squares n=", n, " ", dtype_name(dt));
      Input x = make_input({n}, dt, gpu);
      Input out0 = make_input({1}, DType::F32, gpu, 1.0f, 2.0f);
      Tensor out = out0.device;
      Tensor x_host = dt == DType::F16 ? x.device.to(Device::cpu(), DType::F32, gpu) : x.host;
      ops::sum_squares(x.device, out, gpu);
      ops::sum_squares(x_host, out0.host, Stream::cpu());
      const std::vector<double> first = download(out, gpu);
      expect_close(tag + " (+= into random)", first, test::to_doubles(out0.host), test::kF32AccumRelL2);
      Tensor again = to_device(out0.values, {1}, DType::F32, gpu);
      ops::sum_squares(x.device, again, gpu);
      expect_identical(tag + " two runs", first, download(again, gpu));
    }
  }
}

TEST(ReduceParity, SumRowsAccumulatesIntoItsOutput) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  struct Case {
    int64_t rows, cols;
    DType dt;
  };
  for (const Case& c : {Case{8192, 2048, DType::BF16}, Case{33, 7, DType::BF16},
                        Case{100001, 3, DType::F32}, Case{513, 1000, DType::F32}}) {
    const std::string tag = detail::concat("sum_rows [", c.rows, ", ", c.cols, "] ", dtype_name(c.dt));
    Input x = make_input({c.rows, c.cols}, c.dt, gpu);
    Input out0 = make_input({c.cols}, DType::F32, gpu);
    Tensor out = out0.device;
    ops::sum_rows(x.device, out, gpu);
    ops::sum_rows(x.host, out0.host, Stream::cpu());
    const std::vector<double> first = download(out, gpu);
    expect_close(tag + " (+= into random)", first, test::to_doubles(out0.host), test::kF32AccumRelL2);
    Tensor again = to_device(out0.values, {c.cols}, DType::F32, gpu);
    ops::sum_rows(x.device, again, gpu);
    expect_identical(tag + " two runs", first, download(again, gpu));
  }
}

TEST(ReduceParity, DotAccumulatesIntoItsOutput) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (int64_t n : {int64_t{8192}, int64_t{1000003}, int64_t{3}}) {
    const std::string tag = detail::concat("dot n=", n);
    // Loss weights and losses are positive: a sum without cancellation keeps rel_l2 meaningful.
    Input a = make_input({n}, DType::F32, gpu, 0.0f, 1.0f), b = make_input({n}, DType::F32, gpu, 0.0f, 3.0f);
    Input out0 = make_input({1}, DType::F32, gpu);
    Tensor out = out0.device;
    ops::dot(a.device, b.device, out, gpu);
    ops::dot(a.host, b.host, out0.host, Stream::cpu());
    expect_close(tag + " (+= into random)", download(out, gpu), test::to_doubles(out0.host),
                 test::kF32AccumRelL2);
  }
}
