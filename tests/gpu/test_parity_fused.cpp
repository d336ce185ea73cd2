// GPU parity of the fused ops (docs/kernels/fused_ops.md) against their CPU references on the same
// bf16-rounded
// inputs: the masked-rows fused output layer + cross-entropy, residual add + RMSNorm, QK-norm +
// RoPE on the packed QKV rows, SwiGLU backward with the forward recomputed, multi-tensor AdamW,
// and attention on the packed QKV buffer. Every test skips without a GPU.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <vector>
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/linear_cross_entropy.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/qk_norm_rope.h"
#include "parity.h"
#include "support/attention_cases.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// Loss weights with about half the rows 0 (unmasked tokens) and the selected rows' indices.
struct Selection {
  std::vector<float> weights;
  std::vector<int32_t> rows;
};

Selection select_half(int64_t t, uint64_t seed) {
  Selection s;
  const std::vector<float> u = test::random_floats(t, seed, 0.0f, 1.0f);
  for (int64_t i = 0; i < t; ++i) {
    const bool masked = u[static_cast<size_t>(i)] < 0.5f;
    s.weights.push_back(masked ? 0.5f + u[static_cast<size_t>(i)] : 0.0f);
    if (masked) s.rows.push_back(static_cast<int32_t>(i));
  }
  return s;
}

}  // namespace

TEST(FusedParity, LinearCrossEntropyOverSelectedRowsMatchesCpu) {
  MDLM_REQUIRE_GPU();
  // Tolerances: logits and g are bf16 between the products on CUDA (as in the unfused head), so
  // losses, dx and dweight carry the bf16 rounding of the logits and of g (kBf16ParityRelL2).
  const int64_t t = 333, h = 256, v = 1000;
  Stream gpu = gpu_stream();
  for (bool all_rows : {false, true}) {
    SCOPED_TRACE(all_rows ? "all rows (AR mode)" : "selected rows");
    const Selection sel = select_half(t, fresh_seed());
    Input x = make_input({t, h}, DType::BF16, gpu, -0.5f, 0.5f);
    Input w = make_input({v, h}, DType::BF16, gpu, -0.5f, 0.5f);
    const std::vector<float> tu = test::random_floats(t, fresh_seed(), 0.0f, static_cast<float>(v) - 0.5f);
    std::vector<int32_t> tg;
    for (float f : tu) tg.push_back(static_cast<int32_t>(f));
    const Tensor targets_h = Tensor::from_ints(tg, {t}), targets_d = ints_to_device(tg, {t}, gpu);
    std::vector<float> weights = sel.weights;
    if (all_rows) std::fill(weights.begin(), weights.end(), 1.0f / static_cast<float>(t));
    const Tensor wts_h = Tensor::from_floats(weights, {t}), wts_d = to_device(weights, {t}, DType::F32, gpu);
    const Tensor rows_h = Tensor::from_ints(sel.rows, {static_cast<int64_t>(sel.rows.size())});
    const Tensor rows_d = ints_to_device(sel.rows, {static_cast<int64_t>(sel.rows.size())}, gpu);
    Input dw0 = make_input({v, h}, DType::F32, gpu, -1e-3f, 1e-3f);
    Tensor losses = poisoned({t}, DType::F32, gpu), dx = poisoned({t, h}, DType::BF16, gpu), dw = dw0.device;
    Tensor losses_ref = poisoned_host({t}), dx_ref = poisoned_host({t, h}), dw_ref = dw0.host;
    const ops::LinearCrossEntropyArgs args{.grad_scale = 2.0f, .chunk_rows = 64};
    ops::linear_cross_entropy(x.device, w.device, all_rows ? nullptr : &rows_d, targets_d, wts_d, losses,
                              dx, dw, args, gpu);
    ops::linear_cross_entropy(x.host, w.host, all_rows ? nullptr : &rows_h, targets_h, wts_h, losses_ref,
                              dx_ref, dw_ref, args, Stream::cpu());
    expect_close("linear_cross_entropy losses", download(losses, gpu), test::to_doubles(losses_ref),
                 test::kBf16ParityRelL2);
    expect_close("linear_cross_entropy dx", download(dx, gpu), test::to_doubles(dx_ref), test::kBf16ParityRelL2);
    expect_close("linear_cross_entropy dweight (+=)", download(dw, gpu), test::to_doubles(dw_ref),
                 test::kBf16ParityRelL2);
    // Evaluation: losses only, the same values.
    Tensor eval = poisoned({t}, DType::F32, gpu), none;
    ops::linear_cross_entropy(x.device, w.device, all_rows ? nullptr : &rows_d, targets_d, wts_d, eval,
                              none, none, {.chunk_rows = 1000}, gpu);
    expect_close("linear_cross_entropy eval losses", download(eval, gpu), test::to_doubles(losses_ref),
                 test::kBf16ParityRelL2);
  }
}

TEST(FusedParity, AddRmsNormMatchesCpu) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4099, 2048}, {65, 1001}, {3001, 128}}) {
    const std::string tag = detail::concat("add_rms_norm [", rows, ", ", cols, "]");
    Input x = make_input({rows, cols}, DType::BF16, gpu, -2.0f, 2.0f), r = make_input({rows, cols}, DType::BF16, gpu);
    Input w = make_input({cols}, DType::BF16, gpu, 0.5f, 1.5f);
    Tensor sum = poisoned({rows, cols}, DType::BF16, gpu), y = poisoned({rows, cols}, DType::BF16, gpu);
    Tensor rstd = poisoned({rows}, DType::F32, gpu);
    Tensor sum_ref = poisoned_host({rows, cols}), y_ref = poisoned_host({rows, cols}), rstd_ref = poisoned_host({rows});
    ops::add_rms_norm_forward(x.device, r.device, w.device, sum, y, rstd, 1e-5f, gpu);
    ops::add_rms_norm_forward(x.host, r.host, w.host, sum_ref, y_ref, rstd_ref, 1e-5f, Stream::cpu());
    // The CUDA sum is rounded to bf16 (as ops::add rounds it) and normalised from there.
    expect_close(tag + " sum", download(sum, gpu), test::to_doubles(sum_ref), test::kBf16ParityRelL2);
    expect_close(tag + " y", download(y, gpu), test::to_doubles(y_ref), test::kBf16ParityRelL2);
    expect_close(tag + " rstd", download(rstd, gpu), test::to_doubles(rstd_ref), test::kBf16ParityRelL2);
    // Backward from the CPU's sum and rstd, dx aliasing dresidual (in place).
    Input dy = make_input({rows, cols}, DType::BF16, gpu), dres = make_input({rows, cols}, DType::BF16, gpu);
    Input dw0 = make_input({cols}, DType::F32, gpu);
    Tensor sum_dev = sum_ref.to(gpu.device(), DType::BF16, gpu), rstd_dev = rstd_ref.to(gpu.device(), gpu);
    Tensor sum_host = sum_dev.to(Device::cpu(), DType::F32, gpu);  // the bf16 values the GPU reads
    Tensor dx = dres.device, dx_ref = poisoned_host({rows, cols}), dw = dw0.device, dw_ref = dw0.host;
    ops::rms_norm_backward_add(dy.device, sum_dev, w.device, rstd_dev, dx, dx, dw, gpu);
    ops::rms_norm_backward_add(dy.host, sum_host, w.host, rstd_ref, dres.host, dx_ref, dw_ref, Stream::cpu());
    expect_close(tag + " dx (in place over dresidual)", download(dx, gpu), test::to_doubles(dx_ref),
                 test::kBf16ParityRelL2);
    expect_close(tag + " dweight (+=)", download(dw, gpu), test::to_doubles(dw_ref), test::kF32AccumRelL2);
  }
}

TEST(FusedParity, QkNormRopeMatchesCpu) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  struct Case {
    int64_t t, hq, hkv, d, rotary;
    bool norm;
  };
  // D = 128 with full or no rotation runs the 8-byte-lane kernel, the others the general one.
  // The last two are the 1.7B's shapes: the sampler's batch-16 canvas and training's 8 192 tokens.
  const Case cases[] = {{257, 16, 4, 128, 128, true},    {100, 8, 8, 64, 32, true},
                        {33, 4, 2, 128, 0, true},        {65, 6, 2, 64, 64, false},
                        {129, 16, 16, 128, 128, false},  {40, 4, 4, 128, 64, true},
                        {4608, 16, 16, 128, 128, true},  {8192, 16, 16, 128, 128, true}};
  for (const Case& c : cases) {
    const std::string tag = detail::concat("qk_norm_rope T=", c.t, " Hq=", c.hq, " Hkv=", c.hkv, " D=", c.d,
                                           " rot=", c.rotary, c.norm ? " norm" : " no-norm");
    const int64_t width = (c.hq + 2 * c.hkv) * c.d, normed = c.hq + c.hkv;
    const ops::QkNormRopeArgs a{.heads = c.hq, .kv_heads = c.hkv, .head_dim = c.d, .rotary_dim = c.rotary,
                                .base = 10000.0f, .eps = 1e-6f};
    Input qkv = make_input({c.t, width}, DType::BF16, gpu, -2.0f, 2.0f);
    Input wq = make_input({c.d}, DType::BF16, gpu, 0.5f, 1.5f), wk = make_input({c.d}, DType::BF16, gpu, 0.5f, 1.5f);
    std::vector<int32_t> pos;
    for (int64_t i = 0; i < c.t; ++i) pos.push_back(static_cast<int32_t>((i * 37) % 2048));
    const Tensor pos_h = Tensor::from_ints(pos, {c.t}), pos_d = ints_to_device(pos, {c.t}, gpu);
    const Tensor none;
    const Tensor& wqd = c.norm ? wq.device : none; const Tensor& wkd = c.norm ? wk.device : none;
    const Tensor& wqh = c.norm ? wq.host : none; const Tensor& wkh = c.norm ? wk.host : none;
    Tensor out = poisoned({c.t, width}, DType::BF16, gpu), rstd = poisoned({c.t * normed}, DType::F32, gpu);
    Tensor out_ref = poisoned_host({c.t, width}), rstd_ref = poisoned_host({c.t * normed});
    ops::qk_norm_rope_forward(qkv.device, wqd, wkd, pos_d, out, rstd, a, gpu);
    ops::qk_norm_rope_forward(qkv.host, wqh, wkh, pos_h, out_ref, rstd_ref, a, Stream::cpu());
    expect_close(tag + " out", download(out, gpu), test::to_doubles(out_ref), test::kBf16ParityRelL2);
    {  // in place (inference: out == qkv): bitwise the out-of-place result, value heads kept
      Tensor inplace = qkv.device.to(gpu.device(), gpu), rstd2 = poisoned({c.t * normed}, DType::F32, gpu);
      ops::qk_norm_rope_forward(inplace, wqd, wkd, pos_d, inplace, rstd2, a, gpu);
      EXPECT_EQ(download(inplace, gpu), download(out, gpu)) << tag << " in place";
    }
    {  // without the value copy (training): q, k bitwise the same, the value heads unwritten
      ops::QkNormRopeArgs no_values = a;
      no_values.copy_values = false;
      Tensor qk = poisoned({c.t, width}, DType::BF16, gpu), rstd2 = poisoned({c.t * normed}, DType::F32, gpu);
      ops::qk_norm_rope_forward(qkv.device, wqd, wkd, pos_d, qk, rstd2, no_values, gpu);
      const std::vector<double> got = download(qk, gpu), all = download(out, gpu);
      size_t wrong = 0;
      for (int64_t i = 0; i < c.t * width; ++i) {
        const bool value_column = i % width >= normed * c.d;
        const double g = got[static_cast<size_t>(i)];
        wrong += value_column ? !std::isnan(g) : g != all[static_cast<size_t>(i)];
      }
      EXPECT_EQ(wrong, 0u) << tag << " without the value copy";
    }
    if (c.norm)  // fp32 statistic of the same bf16 inputs
      expect_close(tag + " rstd", download(rstd, gpu), test::to_doubles(rstd_ref), test::kF32AccumRelL2);
    Input dy = make_input({c.t, width}, DType::BF16, gpu);
    Input dwq0 = make_input({c.d}, DType::F32, gpu), dwk0 = make_input({c.d}, DType::F32, gpu);
    Tensor g = dy.device, g_ref = dy.host.to(Device::cpu(), DType::F32, Stream::cpu());
    Tensor dwq = dwq0.device, dwk = dwk0.device, dwq_ref = dwq0.host, dwk_ref = dwk0.host;
    Tensor rstd_dev = rstd_ref.to(gpu.device(), gpu);
    Tensor none_a, none_b;
    ops::qk_norm_rope_backward(g, qkv.device, wqd, wkd, rstd_dev, pos_d, c.norm ? dwq : none_a,
                               c.norm ? dwk : none_b, a, gpu);
    ops::qk_norm_rope_backward(g_ref, qkv.host, wqh, wkh, rstd_ref, pos_h, c.norm ? dwq_ref : none_a,
                               c.norm ? dwk_ref : none_b, a, Stream::cpu());
    expect_close(tag + " dqkv (in place)", download(g, gpu), test::to_doubles(g_ref), test::kBf16ParityRelL2);
    if (c.norm) {
      expect_close(tag + " dq_weight (+=)", download(dwq, gpu), test::to_doubles(dwq_ref), test::kF32AccumRelL2);
      expect_close(tag + " dk_weight (+=)", download(dwk, gpu), test::to_doubles(dwk_ref), test::kF32AccumRelL2);
      // Deterministic weight gradients (two-stage, fixed order): a second run adds the same bits.
      Tensor g2 = dy.device.to(gpu.device(), gpu), a1 = Tensor::zeros({c.d}, DType::F32, gpu), a2 = Tensor::zeros({c.d}, DType::F32, gpu);
      Tensor b1 = Tensor::zeros({c.d}, DType::F32, gpu), b2 = Tensor::zeros({c.d}, DType::F32, gpu);
      Tensor g3 = dy.device.to(gpu.device(), gpu);
      ops::qk_norm_rope_backward(g2, qkv.device, wqd, wkd, rstd_dev, pos_d, a1, b1, a, gpu);
      ops::qk_norm_rope_backward(g3, qkv.device, wqd, wkd, rstd_dev, pos_d, a2, b2, a, gpu);
      expect_identical(tag + " dq_weight twice", download(a1, gpu), download(a2, gpu));
    }
  }
}

TEST(FusedParity, SwiGluBackwardRecomputeMatchesTheSeparateKernelsBitwise) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{777, 1536}, {33, 101}}) {
    const std::string tag = detail::concat("swiglu_backward_recompute [", rows, ", ", 2 * f, "]");
    Input x = make_input({rows, 2 * f}, DType::BF16, gpu, -4.0f, 4.0f), dy = make_input({rows, f}, DType::BF16, gpu);
    Tensor dx = poisoned({rows, 2 * f}, DType::BF16, gpu), y = poisoned({rows, f}, DType::BF16, gpu);
    Tensor dx2 = poisoned({rows, 2 * f}, DType::BF16, gpu), y2 = poisoned({rows, f}, DType::BF16, gpu);
    ops::swiglu_backward_recompute(dy.device, x.device, dx, y, gpu);
    ops::swiglu_backward(dy.device, x.device, dx2, gpu);
    ops::swiglu_forward(x.device, y2, gpu);
    expect_identical(tag + " dx vs swiglu_backward", download(dx, gpu), download(dx2, gpu));
    expect_identical(tag + " y vs swiglu_forward", download(y, gpu), download(y2, gpu));
    Tensor dx_ref = poisoned_host({rows, 2 * f}), y_ref = poisoned_host({rows, f});
    ops::swiglu_backward_recompute(dy.host, x.host, dx_ref, y_ref, Stream::cpu());
    expect_close(tag + " dx", download(dx, gpu), test::to_doubles(dx_ref), test::kBf16ParityRelL2);
    expect_close(tag + " y", download(y, gpu), test::to_doubles(y_ref), test::kBf16ParityRelL2);
  }
}

TEST(FusedParity, MultiTensorAdamWIsBitwiseTheStepPerSegment) {
  MDLM_REQUIRE_GPU();
  // Segments of sizes that cross the kernel's 4096-element tiles at odd offsets, one not decayed,
  // differing state and parameter offsets, and a gap left untouched.
  Stream gpu = gpu_stream();
  const int64_t n = 100000;
  const std::vector<ops::AdamWSegment> segs = {{.state_offset = 0, .param_offset = 5, .numel = 4097, .decay = true},
                                               {.state_offset = 4097, .param_offset = 4102, .numel = 3, .decay = false},
                                               {.state_offset = 4100, .param_offset = 4105, .numel = 60000, .decay = true},
                                               {.state_offset = 70001, .param_offset = 70001, .numel = 29999, .decay = false}};
  const ops::AdamWArgs args{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 7};
  Input p = make_input({n}, DType::F32, gpu), g = make_input({n}, DType::F32, gpu, -1e-2f, 1e-2f);
  Input m = make_input({n}, DType::F32, gpu, -1e-3f, 1e-3f), v = make_input({n}, DType::F32, gpu, 0.0f, 1e-5f);
  auto copy = [&](const Tensor& t) { return t.to(gpu.device(), gpu); };
  std::vector<Tensor> a = {copy(p.device), copy(g.device), copy(m.device), copy(v.device), Tensor::zeros({n}, DType::BF16, gpu)};
  std::vector<Tensor> b = {copy(p.device), copy(g.device), copy(m.device), copy(v.device), Tensor::zeros({n}, DType::BF16, gpu)};
  ops::adamw_step_multi(a[0], a[1], a[2], a[3], a[4], segs, args, gpu);
  for (const ops::AdamWSegment& s : segs) {
    Tensor bp = b[0].slice_flat(s.state_offset, {s.numel}), bg = b[1].slice_flat(s.state_offset, {s.numel});
    Tensor bm = b[2].slice_flat(s.state_offset, {s.numel}), bv = b[3].slice_flat(s.state_offset, {s.numel});
    Tensor bparam = b[4].slice_flat(s.param_offset, {s.numel});
    ops::AdamWArgs one = args;
    one.weight_decay = s.decay ? args.weight_decay : 0.0f;
    ops::adamw_step(bp, bg, bm, bv, bparam, one, gpu);
  }
  const char* names[] = {"master", "grad", "exp_avg", "exp_avg_sq", "bf16 param"};
  for (int i = 0; i < 5; ++i)
    expect_identical(std::string("adamw_step_multi vs per segment: ") + names[i], download(a[static_cast<size_t>(i)], gpu),
                     download(b[static_cast<size_t>(i)], gpu));
}

TEST(FusedParity, PackedQkvAttentionMatchesCpu) {
  MDLM_REQUIRE_GPU();
  // The packed entries on CUDA (cuDNN reads the rows in place; the flash backend splits) against
  // the CPU reference on the split tensors; dense and packed-document rows, MHA and GQA.
  Stream gpu = gpu_stream();
  const test::AttentionCase cases[] = {{2, 300, 4, 2, 128, ops::AttentionMask::None},
                                       {1, 256, 4, 4, 64, ops::AttentionMask::Causal}};
  for (const auto& c : cases) {
    for (ops::AttentionBackend backend : {ops::AttentionBackend::Auto, ops::AttentionBackend::Flash}) {
      for (bool documents : {false, true}) {
        const std::string tag = test::name_of(c) + " " + ops::attention_backend_name(backend) +
                                (documents ? " documents" : "");
        const int64_t t = c.batch * c.seq, width = (c.heads + 2 * c.kv_heads) * c.dim;
        ops::AttentionArgs a = test::attention_args(c, {}, 1, 0);
        a.backend = backend;
        Input qkv = make_input({t, width}, DType::BF16, gpu, -2.0f, 2.0f);
        std::vector<int32_t> ids, starts;
        for (int64_t b = 0; b < c.batch; ++b)
          for (int64_t i = 0; i < c.seq; ++i) {
            ids.push_back(static_cast<int32_t>(i / 50));  // documents of 50 tokens
            if (i % 50 == 0) starts.push_back(static_cast<int32_t>(b * c.seq + i));
          }
        starts.push_back(static_cast<int32_t>(t));
        const Tensor ids_h = Tensor::from_ints(ids, {c.batch, c.seq}), ids_d = ints_to_device(ids, {c.batch, c.seq}, gpu);
        const Tensor starts_d = ints_to_device(starts, {static_cast<int64_t>(starts.size())}, gpu);
        ops::AttentionArgs a_host = a;
        if (documents) {
          a.document_ids = &ids_d;
          a.document_starts = &starts_d;
          a_host.document_ids = &ids_h;
        }
        Tensor out = poisoned(test::q_shape(c), DType::BF16, gpu), lse = poisoned(test::lse_shape(c), DType::F32, gpu);
        Tensor out_ref = poisoned_host(test::q_shape(c)), lse_ref = poisoned_host(test::lse_shape(c));
        ops::attention_forward_packed(qkv.device, out, lse, a, gpu);
        ops::attention_forward_packed(qkv.host, out_ref, lse_ref, a_host, Stream::cpu());
        expect_close(tag + " packed out", download(out, gpu), test::to_doubles(out_ref), test::kBf16ParityRelL2);
        Input dout = make_input(test::q_shape(c), DType::BF16, gpu);
        Tensor dqkv = poisoned({t, width}, DType::BF16, gpu), dqkv_ref = poisoned_host({t, width});
        Tensor out_dev = out_ref.to(gpu.device(), DType::BF16, gpu), lse_dev = lse_ref.to(gpu.device(), gpu);
        Tensor out_host = out_dev.to(Device::cpu(), DType::F32, gpu);
        ops::attention_backward_packed(dout.device, qkv.device, out_dev, lse_dev, dqkv, a, gpu);
        ops::attention_backward_packed(dout.host, qkv.host, out_host, lse_ref, dqkv_ref, a_host, Stream::cpu());
        expect_close(tag + " packed dqkv", download(dqkv, gpu), test::to_doubles(dqkv_ref), test::kBf16ParityRelL2);
        // The values from a second buffer (training: q, k rotated into their own rows, v left in
        // the projection's output), the columns not read poisoned.
        std::vector<float> qk_only = qkv.values, v_only = qkv.values;
        const int64_t qk_width = (c.heads + c.kv_heads) * c.dim;
        for (int64_t i = 0; i < t * width; ++i) (i % width < qk_width ? v_only : qk_only)[static_cast<size_t>(i)] = NAN;
        const Tensor qk_rows = to_device(qk_only, {t, width}, DType::BF16, gpu);
        const Tensor v_rows = to_device(v_only, {t, width}, DType::BF16, gpu);
        Tensor out2 = poisoned(test::q_shape(c), DType::BF16, gpu), lse2 = poisoned(test::lse_shape(c), DType::F32, gpu);
        ops::attention_forward_packed(qk_rows, v_rows, out2, lse2, a, gpu);
        expect_identical(tag + " out, values from a second buffer", download(out2, gpu), download(out, gpu));
        Tensor dqkv2 = poisoned({t, width}, DType::BF16, gpu);
        ops::attention_backward_packed(dout.device, qk_rows, v_rows, out_dev, lse_dev, dqkv2, a, gpu);
        expect_close(tag + " dqkv, values from a second buffer", download(dqkv2, gpu), test::to_doubles(dqkv_ref),
                     test::kBf16ParityRelL2);
        EXPECT_EQ(ops::attention_packed_reads_in_place(a, gpu), backend == ops::AttentionBackend::Auto &&
                                                                    !(documents && c.heads != c.kv_heads))
            << tag;
      }
    }
  }
}
