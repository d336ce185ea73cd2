// Activation parity: SwiGLU and exact-erf GELU on CUDA (bf16 and f32, vectorized and odd widths)
// against the CPU reference on the same bf16-rounded inputs, forward and backward.
#include <gtest/gtest.h>
#include "megadlm/ops/activation.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// bf16 outputs: kBf16ParityRelL2. f32 outputs: the CUDA kernels use __expf/__fdividef (~2 ulp)
/// and erff, so a few ulp per element, far under kF32AccumRelL2.
double tol(DType dt) { return dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32AccumRelL2; }

void check_swiglu(int64_t rows, int64_t f, DType dt) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("swiglu [", rows, ", 2*", f, "] ", dtype_name(dt));
  Input x = make_input({rows, 2 * f}, dt, gpu, -6.0f, 6.0f);
  Tensor y = poisoned({rows, f}, dt, gpu), y_ref = poisoned_host({rows, f});
  ops::swiglu_forward(x.device, y, gpu);
  ops::swiglu_forward(x.host, y_ref, Stream::cpu());
  expect_close(tag + " forward", download(y, gpu), test::to_doubles(y_ref), tol(dt));
  Input dy = make_input({rows, f}, dt, gpu);
  Tensor dx = poisoned({rows, 2 * f}, dt, gpu), dx_ref = poisoned_host({rows, 2 * f});
  ops::swiglu_backward(dy.device, x.device, dx, gpu);
  ops::swiglu_backward(dy.host, x.host, dx_ref, Stream::cpu());
  expect_close(tag + " backward", download(dx, gpu), test::to_doubles(dx_ref), tol(dt));
}

void check_gelu(const Shape& shape, DType dt) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("gelu ", shape_str(shape), " ", dtype_name(dt));
  Input x = make_input(shape, dt, gpu, -6.0f, 6.0f);
  Tensor y = poisoned(shape, dt, gpu), y_ref = poisoned_host(shape);
  ops::gelu_forward(x.device, y, gpu);
  ops::gelu_forward(x.host, y_ref, Stream::cpu());
  expect_close(tag + " forward", download(y, gpu), test::to_doubles(y_ref), tol(dt));
  Input dy = make_input(shape, dt, gpu);
  Tensor dx = poisoned(shape, dt, gpu), dx_ref = poisoned_host(shape);
  ops::gelu_backward(dy.device, x.device, dx, gpu);
  ops::gelu_backward(dy.host, x.host, dx_ref, Stream::cpu());
  expect_close(tag + " backward", download(dx, gpu), test::to_doubles(dx_ref), tol(dt));
}

}  // namespace

TEST(SwigluParity, MatchesCpuForwardAndBackward) {
  MDLM_REQUIRE_GPU();
  check_swiglu(333, 6144, DType::BF16);
  check_swiglu(70000, 64, DType::BF16);  // more rows than the grid's 65535 y-blocks
  check_swiglu(97, 1001, DType::BF16);   // odd width: single-element path
  check_swiglu(129, 512, DType::F32);
  check_swiglu(31, 77, DType::F32);
}

TEST(GeluParity, MatchesCpuForwardAndBackward) {
  MDLM_REQUIRE_GPU();
  check_gelu({1024, 4096}, DType::BF16);
  check_gelu({1001, 333}, DType::BF16);  // odd element count: vector body plus tail
  check_gelu({77, 129}, DType::F32);
}
