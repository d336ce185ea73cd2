// AdamW parity: the CUDA step (f32 master/grad/moments, optional bf16 or f32 model parameter)
// against the CPU reference on identical inputs, at step 1 and a later step, with weight decay,
// an odd length (vector body plus tail) and a misaligned flat slice (single-element path).
#include <gtest/gtest.h>
#include "megadlm/ops/elementwise.h"
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

TEST(AdamWParity, GradScaleIsBitwiseTheStepOnGradientsScaledFirst) {
  MDLM_REQUIRE_GPU();
  // The trainer folds the clip coefficient into the step (AdamWArgs::grad_scale): on CUDA too,
  // the step must be bitwise the one after scale_inplace(grad, coeff), with the bf16 parameter
  // write, for the single step (vector body, odd tail) and the multi-tensor step, and the
  // gradients must be left unchanged.
  Stream gpu = gpu_stream();
  const int64_t n = 1000003;
  const std::vector<ops::AdamWSegment> segs = {{.state_offset = 0, .param_offset = 0, .numel = 400001, .decay = true},
                                               {.state_offset = 400001, .param_offset = 400001, .numel = 600002, .decay = false}};
  Input p = make_input({n}, DType::F32, gpu), g = make_input({n}, DType::F32, gpu, -3.0f, 3.0f);
  Input m = make_input({n}, DType::F32, gpu, -1e-3f, 1e-3f), v = make_input({n}, DType::F32, gpu, 0.0f, 1e-5f);
  auto copy = [&](const Tensor& t) { return t.to(gpu.device(), gpu); };
  for (const float coeff : {0.37312f, 1e-3f}) {
    for (const bool multi : {false, true}) {
      const ops::AdamWArgs args{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 9};
      ops::AdamWArgs folded_args = args;
      folded_args.grad_scale = coeff;
      auto run = [&](std::vector<Tensor>& b, const ops::AdamWArgs& a) {
        if (multi) ops::adamw_step_multi(b[0], b[1], b[2], b[3], b[4], segs, a, gpu);
        else ops::adamw_step(b[0], b[1], b[2], b[3], b[4], a, gpu);
      };
      std::vector<Tensor> first = {copy(p.device), copy(g.device), copy(m.device), copy(v.device), Tensor::zeros({n}, DType::BF16, gpu)};
      std::vector<Tensor> folded = {copy(p.device), copy(g.device), copy(m.device), copy(v.device), Tensor::zeros({n}, DType::BF16, gpu)};
      ops::scale_inplace(first[1], coeff, gpu);
      run(first, args);
      run(folded, folded_args);
      const std::string tag = detail::concat("adamw grad_scale ", coeff, multi ? " multi" : " single", ": ");
      const char* names[] = {"master", "grad", "exp_avg", "exp_avg_sq", "bf16 param"};
      for (int i : {0, 2, 3, 4})
        expect_identical(tag + names[i], download(first[static_cast<size_t>(i)], gpu),
                         download(folded[static_cast<size_t>(i)], gpu));
      expect_identical(tag + "gradients left unchanged", download(folded[1], gpu), download(g.device, gpu));
    }
  }
}
