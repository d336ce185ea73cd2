// AdamW parity: the CUDA step (f32 master/grad/moments, optional bf16 or f32 model parameter)
// against the CPU reference on identical inputs, at step 1 and a later step, with weight decay,
// an odd length (vector body plus tail) and a misaligned flat slice (single-element path).
#include <gtest/gtest.h>
#include "megadlm/ops/optimizer.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// master/exp_avg/exp_avg_sq evaluate the CPU's fp32 formula term for term:
/// kF32ElementwiseRelL2. The bf16 model parameter is the rounded master: kBf16ParityRelL2
/// (equal in practice unless a master differs by an ulp right at a rounding boundary).
void check(int64_t n, int64_t offset, DType param_dtype, bool with_param, int64_t step) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("adamw n=", n, " offset=", offset, " step=", step,
                                         with_param ? detail::concat(" param ", dtype_name(param_dtype))
                                                    : std::string(" no param"));
  const ops::AdamWArgs args{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                            .weight_decay = 0.1f, .step = step};
  // One buffer of offset + n elements per state; the op runs on the slice [offset, offset + n).
  const Shape full{offset + n};
  Input master = make_input(full, DType::F32, gpu);
  Input grad = make_input(full, DType::F32, gpu, -1e-2f, 1e-2f);
  Input m = make_input(full, DType::F32, gpu, -1e-3f, 1e-3f);
  Input v = make_input(full, DType::F32, gpu, 0.0f, 1e-5f);
  auto slice = [&](const Tensor& t) { return t.slice_flat(offset, {n}); };
  Tensor dm = slice(master.device), dg = slice(grad.device), dmo = slice(m.device), dv = slice(v.device);
  Tensor hm = slice(master.host), hg = slice(grad.host), hmo = slice(m.host), hv = slice(v.host);
  Tensor param_full = poisoned(full, param_dtype, gpu);
  Tensor dparam = with_param ? slice(param_full) : Tensor();
  Tensor hparam = with_param ? poisoned_host({n}) : Tensor();
  ops::adamw_step(dm, dg, dmo, dv, dparam, args, gpu);
  ops::adamw_step(hm, hg, hmo, hv, hparam, args, Stream::cpu());
  expect_close(tag + " master", download(dm, gpu), test::to_doubles(hm), test::kF32ElementwiseRelL2);
  expect_close(tag + " exp_avg", download(dmo, gpu), test::to_doubles(hmo), test::kF32ElementwiseRelL2);
  expect_close(tag + " exp_avg_sq", download(dv, gpu), test::to_doubles(hv), test::kF32ElementwiseRelL2);
  if (with_param)
    expect_close(tag + " model_param", download(dparam, gpu), test::to_doubles(hparam),
                 param_dtype == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32ElementwiseRelL2);
}

}  // namespace

TEST(AdamWParity, MatchesCpuStep) {
  MDLM_REQUIRE_GPU();
  check(1000003, 0, DType::BF16, true, 1);
  check(1000003, 0, DType::BF16, true, 1000);
  check(65536, 0, DType::F32, true, 7);
  check(4099, 0, DType::F32, false, 3);
  check(4099, 1, DType::BF16, true, 2);  // 4-byte-aligned slice: single-element path
}
