// megadlm_bench ops: the fused ops (docs/kernels/fused_ops.md) at the 1.7B shapes (T = 8192
// tokens), each next to
// the unfused sequence it replaces:
//   lm_head_unfused              logits GEMM + cross_entropy_forward_backward + dgrad + wgrad, all rows
//   lm_head_fused_masked         linear_cross_entropy over half the rows (the diffusion loss rows)
//   lm_head_fused_all            linear_cross_entropy over every row (the AR mode)
//   add_rms_norm_fwd / rms_norm_bwd_add   residual add fused with the next RMSNorm (and back)
//   qk_unfused_fwd / qk_norm_rope_fwd / qk_norm_rope_bwd   split + 2 norms + 2 RoPE vs the fused pass
//   qk_norm_rope_fwd_no_values                           training's pass: q and k only
//   swiglu_bwd_recompute         SwiGLU backward that also recomputes the forward output
//   adamw_per_param / adamw_multi   one layer's 11 parameters: 11 launches vs one
//   attention_{fwd,bwd}_packed[_s8192]_cudnn  attention on the packed QKV rows (no split/concat copies), B4 S2048 and B1 S8192
// LM-head rates count the useful FLOPs (6 R V H for R rows); memory-bound rows count bytes.
#include <cmath>
#include <vector>
#include "megadlm/core/error.h"
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/linear_cross_entropy.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/qk_norm_rope.h"
#include "megadlm/ops/rope.h"
#include "megadlm_bench/bench.h"

namespace megadlm::bench {
namespace {

/// Every second row selected (the diffusion objective masks about half the tokens).
std::vector<int32_t> half_rows(int64_t t) {
  std::vector<int32_t> r;
  for (int64_t i = 0; i < t; i += 2) r.push_back(static_cast<int32_t>(i));
  return r;
}

std::vector<float> half_weights(int64_t t) {
  std::vector<float> w(static_cast<size_t>(t), 0.0f);
  for (int64_t i = 0; i < t; i += 2) w[static_cast<size_t>(i)] = 1.0f / static_cast<float>(t);
  return w;
}

std::vector<OpBench> lm_head_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, H = kHidden, V = kVocab;
  for (int mode = 0; mode < 3; ++mode) {  // 0 unfused, 1 fused masked, 2 fused all rows
    OpBench b;
    b.name = mode == 0 ? "lm_head_unfused" : mode == 1 ? "lm_head_fused_masked" : "lm_head_fused_all";
    b.shape = mode == 1 ? "x [8192, 2048] W [50304, 2048], 4096 rows" : "x [8192, 2048] W [50304, 2048]";
    b.flops = 6.0 * static_cast<double>(mode == 1 ? T / 2 : T) * V * H;
    b.check = [mode](const Stream& s) {
      const int64_t t = 96, h = 128, v = 700;
      Pair x = make_pair({t, h}, DType::BF16, s, -0.5f, 0.5f), w = make_pair({v, h}, DType::BF16, s, -0.5f, 0.5f);
      const std::vector<int32_t> tg = random_ints(t, static_cast<int32_t>(v));
      const std::vector<float> wt = half_weights(t);
      const std::vector<int32_t> rows = half_rows(t);
      Tensor th = Tensor::from_ints(tg, {t}), td = device_ints(tg, s);
      Tensor wh = Tensor::from_floats(wt, {t}), wd = wh.to(s.device(), s);
      Tensor rh = Tensor::from_ints(rows, {static_cast<int64_t>(rows.size())}), rd = device_ints(rows, s);
      Pair losses = make_pair({t}, DType::F32, s), dx = make_pair({t, h}, DType::BF16, s);
      Pair dw = make_pair({v, h}, DType::F32, s, -1e-4f, 1e-4f);
      const ops::LinearCrossEntropyArgs args{.grad_scale = 1.0f, .chunk_rows = 40};
      ops::linear_cross_entropy(x.dev, w.dev, mode == 2 ? nullptr : &rd, td, wd, losses.dev, dx.dev, dw.dev, args, s);
      ops::linear_cross_entropy(x.host, w.host, mode == 2 ? nullptr : &rh, th, wh, losses.host, dx.host, dw.host,
                                args, Stream::cpu());
      Check c;
      c.add(rel_err(losses.dev, losses.host, s), kTolBf16);  // from bf16 logits
      c.add(rel_err(dx.dev, dx.host, s), kTolBf16);
      c.add(rel_err(dw.dev, dw.host, s), kTolBf16);
      return c;
    };
    b.setup = [mode, T, H, V](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, H}, DType::BF16, s, -0.5f, 0.5f), w = random_device({V, H}, DType::BF16, s, -0.05f, 0.05f);
      Tensor targets = device_ints(random_ints(T, static_cast<int32_t>(V)), s);
      Tensor weights = Tensor::from_floats(half_weights(T), {T}).to(s.device(), s);
      Tensor rows = device_ints(half_rows(T), s);
      Tensor losses = Tensor::empty({T}, DType::F32, s), dx = Tensor::empty({T, H}, DType::BF16, s);
      Tensor dw = Tensor::zeros({V, H}, DType::F32, s);
      if (mode == 0) {
        Tensor logits = Tensor::empty({T, V}, DType::BF16, s);
        return [=, &s]() mutable {
          ops::gemm(x, w, logits, {.trans_b = true}, s);
          ops::cross_entropy_forward_backward(logits, targets, weights, losses, 1.0f, s);
          ops::gemm(logits, w, dx, {}, s);
          ops::gemm(logits, x, dw, {.trans_a = true, .beta = 1.0f}, s);
        };
      }
      return [=, &s]() mutable {
        ops::linear_cross_entropy(x, w, mode == 1 ? &rows : nullptr, targets, weights, losses, dx, dw,
                                  {.grad_scale = 1.0f}, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> norm_fusion_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, H = kHidden;
  const double act = 2.0 * T * H;
  for (bool backward : {false, true}) {
    OpBench b;
    b.name = backward ? "rms_norm_bwd_add" : "add_rms_norm_fwd";
    b.shape = "[8192, 2048] bf16";
    // fwd: x, residual read; sum, y written; bwd: dy, x, dresidual read; dx written.
    b.bytes = 4 * act + 4.0 * T;
    b.check = [backward](const Stream& s) {
      const int64_t r = 301, c = 2048;
      Pair x = make_pair({r, c}, DType::BF16, s), res = make_pair({r, c}, DType::BF16, s);
      Pair w = make_pair({c}, DType::BF16, s, 0.5f, 1.5f), y = make_pair({r, c}, DType::BF16, s);
      Pair sum = make_pair({r, c}, DType::BF16, s), rstd = make_pair({r}, DType::F32, s, 0.5f, 2.0f);
      Check k;
      if (backward) {
        Pair dw = make_pair({c}, DType::F32, s), dx = make_pair({r, c}, DType::BF16, s);
        ops::rms_norm_backward_add(y.dev, x.dev, w.dev, rstd.dev, res.dev, dx.dev, dw.dev, s);
        ops::rms_norm_backward_add(y.host, x.host, w.host, rstd.host, res.host, dx.host, dw.host, Stream::cpu());
        k.add(rel_err(dx.dev, dx.host, s), kTolBf16);
        k.add(rel_err(dw.dev, dw.host, s), kTolF32);
      } else {
        ops::add_rms_norm_forward(x.dev, res.dev, w.dev, sum.dev, y.dev, rstd.dev, 1e-5f, s);
        ops::add_rms_norm_forward(x.host, res.host, w.host, sum.host, y.host, rstd.host, 1e-5f, Stream::cpu());
        k.add(rel_err(sum.dev, sum.host, s), kTolBf16);
        k.add(rel_err(y.dev, y.host, s), kTolBf16);
      }
      return k;
    };
    b.setup = [backward, T, H](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, H}, DType::BF16, s), r = random_device({T, H}, DType::BF16, s);
      Tensor w = random_device({H}, DType::BF16, s, 0.5f, 1.5f), y = Tensor::empty({T, H}, DType::BF16, s);
      Tensor sum = Tensor::empty({T, H}, DType::BF16, s), rstd = random_device({T}, DType::F32, s, 0.5f, 2.0f);
      Tensor dw = Tensor::zeros({H}, DType::F32, s), dx = Tensor::empty({T, H}, DType::BF16, s);
      return [=, &s]() mutable {
        if (backward) ops::rms_norm_backward_add(y, x, w, rstd, r, dx, dw, s);
        else ops::add_rms_norm_forward(x, r, w, sum, y, rstd, 1e-5f, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> qk_benches() {
  constexpr int64_t kInPlaceTokens = 16 * 288;
  std::vector<OpBench> out;
  const int64_t T = kTokens, Hq = kHeads, Hkv = kHeads, D = kHeadDim;
  const int64_t W = (Hq + 2 * Hkv) * D;
  const ops::QkNormRopeArgs args{.heads = Hq, .kv_heads = Hkv, .head_dim = D, .rotary_dim = D, .base = 10000.0f,
                                 .eps = 1e-6f};
  const char* names[] = {"qk_unfused_fwd", "qk_norm_rope_fwd", "qk_norm_rope_bwd", "qk_norm_rope_fwd_in_place",
                         "qk_norm_rope_fwd_no_values"};
  for (int op = 0; op < 5; ++op) {
    OpBench b;
    b.name = names[op];
    b.shape = op == 3 ? "qkv [4608, 48 x 128] bf16, in place"
              : op == 4 ? "qkv [8192, 48 x 128] bf16, q and k written (training: v read from qkv)"
                        : "qkv [8192, 48 x 128] bf16";
    // The fused pass reads and writes each row once (backward also reads qkv); the unfused path
    // is charged the same bytes so its rate shows how much slower it moves them. In place (the
    // sampler's batch-16 canvas, 16 x 288 tokens) only the query and key heads move.
    b.bytes = op == 3 ? 2.0 * 2.0 * kInPlaceTokens * (Hq + Hkv) * D
              : op == 4 ? 2.0 * 2.0 * T * (Hq + Hkv) * D
                        : (op == 2 ? 3.0 : 2.0) * 2.0 * T * W;
    b.check = [op, args](const Stream& s) {
      const int64_t t = 37, w = (args.heads + 2 * args.kv_heads) * args.head_dim;
      Pair qkv = make_pair({t, w}, DType::BF16, s, -2.0f, 2.0f);
      Pair wq = make_pair({args.head_dim}, DType::BF16, s, 0.5f, 1.5f), wk = make_pair({args.head_dim}, DType::BF16, s, 0.5f, 1.5f);
      std::vector<int32_t> pos(static_cast<size_t>(t));
      for (int64_t i = 0; i < t; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i * 31);
      Tensor ph = Tensor::from_ints(pos, {t}), pd = device_ints(pos, s);
      Pair o = make_pair({t, w}, DType::BF16, s), rstd = make_pair({t * (args.heads + args.kv_heads)}, DType::F32, s);
      ops::qk_norm_rope_forward(qkv.dev, wq.dev, wk.dev, pd, o.dev, rstd.dev, args, s);
      ops::qk_norm_rope_forward(qkv.host, wq.host, wk.host, ph, o.host, rstd.host, args, Stream::cpu());
      Check k;
      k.add(rel_err(o.dev, o.host, s), kTolBf16);
      if (op == 2) {
        Pair g = make_pair({t, w}, DType::BF16, s), dwq = make_pair({args.head_dim}, DType::F32, s);
        Pair dwk = make_pair({args.head_dim}, DType::F32, s);
        Tensor rd = rstd.host.to(s.device(), s);
        ops::qk_norm_rope_backward(g.dev, qkv.dev, wq.dev, wk.dev, rd, pd, dwq.dev, dwk.dev, args, s);
        ops::qk_norm_rope_backward(g.host, qkv.host, wq.host, wk.host, rstd.host, ph, dwq.host, dwk.host, args,
                                   Stream::cpu());
        k.add(rel_err(g.dev, g.host, s), kTolBf16);
        k.add(rel_err(dwq.dev, dwq.host, s), kTolF32);
      }
      return k;
    };
    b.setup = [op, args, T, W](const Stream& s) -> std::function<void()> {
      const int64_t D = args.head_dim, Hq = args.heads, Hkv = args.kv_heads;
      Tensor qkv = random_device({T, W}, DType::BF16, s, -2.0f, 2.0f), o = Tensor::empty({T, W}, DType::BF16, s);
      Tensor wq = random_device({D}, DType::BF16, s, 0.5f, 1.5f), wk = random_device({D}, DType::BF16, s, 0.5f, 1.5f);
      std::vector<int32_t> pos(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i % 2048);
      Tensor p = device_ints(pos, s), rstd = random_device({T * (Hq + Hkv)}, DType::F32, s, 0.5f, 2.0f);
      Tensor dwq = Tensor::zeros({D}, DType::F32, s), dwk = Tensor::zeros({D}, DType::F32, s);
      Tensor q = Tensor::empty({T, Hq * D}, DType::BF16, s), k = Tensor::empty({T, Hkv * D}, DType::BF16, s);
      Tensor v = Tensor::empty({T, Hkv * D}, DType::BF16, s), qn = Tensor::empty({T * Hq, D}, DType::BF16, s);
      Tensor kn = Tensor::empty({T * Hkv, D}, DType::BF16, s), rq = Tensor::empty({T * Hq}, DType::F32, s);
      Tensor rk = Tensor::empty({T * Hkv}, DType::F32, s);
      return [=, &s]() mutable {
        if (op == 0) {  // what the transformer layer does today
          ops::split_columns(qkv, {&q, &k, &v}, s);
          ops::rms_norm_forward(q.view({T * Hq, D}), wq, qn, rq, args.eps, s);
          ops::rms_norm_forward(k.view({T * Hkv, D}), wk, kn, rk, args.eps, s);
          Tensor qr = qn.view({T, Hq * D}), kr = kn.view({T, Hkv * D});
          ops::rope_forward(qr, p, {Hq, D, D, args.base}, s);
          ops::rope_forward(kr, p, {Hkv, D, D, args.base}, s);
        } else if (op == 1) {
          ops::qk_norm_rope_forward(qkv, wq, wk, p, o, rstd, args, s);
        } else if (op == 4) {
          ops::QkNormRopeArgs no_values = args;
          no_values.copy_values = false;
          ops::qk_norm_rope_forward(qkv, wq, wk, p, o, rstd, no_values, s);
        } else if (op == 3) {
          Tensor rows = qkv.narrow(0, kInPlaceTokens);
          Tensor row_rstd = rstd.narrow(0, kInPlaceTokens * (Hq + Hkv));
          ops::qk_norm_rope_forward(rows, wq, wk, p.narrow(0, kInPlaceTokens), rows, row_rstd, args, s);
        } else {
          ops::qk_norm_rope_backward(o, qkv, wq, wk, rstd, p, dwq, dwk, args, s);
        }
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> swiglu_recompute_benches() {
  const int64_t T = kTokens, F = kFfn;
  OpBench b;
  b.name = "swiglu_bwd_recompute";
  b.shape = "[8192, 12288] -> dx, y";
  b.bytes = 2.0 * (T * F + T * 2 * F + T * 2 * F + T * F);
  b.check = [](const Stream& s) {
    const int64_t r = 77, f = 1536;
    Pair x = make_pair({r, 2 * f}, DType::BF16, s, -4, 4), dy = make_pair({r, f}, DType::BF16, s);
    Pair dx = make_pair({r, 2 * f}, DType::BF16, s), y = make_pair({r, f}, DType::BF16, s);
    ops::swiglu_backward_recompute(dy.dev, x.dev, dx.dev, y.dev, s);
    ops::swiglu_backward_recompute(dy.host, x.host, dx.host, y.host, Stream::cpu());
    Check k;
    k.add(rel_err(dx.dev, dx.host, s), kTolBf16);
    k.add(rel_err(y.dev, y.host, s), kTolBf16);
    return k;
  };
  b.setup = [T, F](const Stream& s) -> std::function<void()> {
    Tensor x = random_device({T, 2 * F}, DType::BF16, s, -4, 4), dy = random_device({T, F}, DType::BF16, s);
    Tensor dx = Tensor::empty({T, 2 * F}, DType::BF16, s), y = Tensor::empty({T, F}, DType::BF16, s);
    return [=, &s]() mutable { ops::swiglu_backward_recompute(dy, x, dx, y, s); };
  };
  return {b};
}

/// One 1.7B layer's parameters in the flat buffer's order (q, k, v, proj, fc1 gate, fc1 up, fc2,
/// two RMSNorm weights, two QK-norm weights): the sizes adamw_step sees one launch each.
std::vector<ops::AdamWSegment> layer_segments() {
  const int64_t h = kHidden, f = kFfn, d = kHeadDim;
  const std::vector<std::pair<int64_t, bool>> params = {{h * h, true}, {h * h, true}, {h * h, true}, {h * h, true},
                                                        {f * h, true}, {f * h, true}, {h * f, true}, {h, false},
                                                        {h, false},    {d, false},    {d, false}};
  std::vector<ops::AdamWSegment> segs;
  int64_t off = 0;
  for (const auto& [n, decay] : params) {
    segs.push_back({.state_offset = off, .param_offset = off, .numel = n, .decay = decay});
    off += n;
  }
  return segs;
}

std::vector<OpBench> adamw_multi_benches() {
  std::vector<OpBench> out;
  const ops::AdamWArgs args{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f, .step = 10};
  const std::vector<ops::AdamWSegment> segs = layer_segments();
  int64_t n = 0;
  for (const auto& s : segs) n += s.numel;
  for (bool multi : {false, true}) {
    OpBench b;
    b.name = multi ? "adamw_multi" : "adamw_per_param";
    b.shape = multi ? "one 1.7B layer, 1 launch" : "one 1.7B layer, 11 launches";
    b.bytes = static_cast<double>(n) * (4 * 4 + 3 * 4 + 2);
    b.check = [args](const Stream& s) {
      const int64_t m = 10007;
      const std::vector<ops::AdamWSegment> small = {{.state_offset = 0, .param_offset = 0, .numel = 5003, .decay = true},
                                                    {.state_offset = 5003, .param_offset = 5003, .numel = 5004, .decay = false}};
      Pair p = make_pair({m}, DType::F32, s), g = make_pair({m}, DType::F32, s, -1e-2f, 1e-2f);
      Pair mm = make_pair({m}, DType::F32, s, -1e-3f, 1e-3f), v = make_pair({m}, DType::F32, s, 0, 1e-5f);
      Pair param = make_pair({m}, DType::BF16, s);
      ops::adamw_step_multi(p.dev, g.dev, mm.dev, v.dev, param.dev, small, args, s);
      ops::adamw_step_multi(p.host, g.host, mm.host, v.host, param.host, small, args, Stream::cpu());
      Check k;
      k.add(rel_err(p.dev, p.host, s), 1e-6);
      k.add(rel_err(param.dev, param.host, s), kTolBf16);
      return k;
    };
    b.setup = [multi, args, segs, n](const Stream& s) -> std::function<void()> {
      Tensor p = random_device({n}, DType::F32, s), g = random_device({n}, DType::F32, s, -1e-2f, 1e-2f);
      Tensor m = random_device({n}, DType::F32, s, -1e-3f, 1e-3f), v = random_device({n}, DType::F32, s, 0, 1e-5f);
      Tensor param = Tensor::empty({n}, DType::BF16, s);
      return [=, &s]() mutable {
        if (multi) {
          ops::adamw_step_multi(p, g, m, v, param, segs, args, s);
          return;
        }
        for (const ops::AdamWSegment& seg : segs) {
          Tensor sp = p.slice_flat(seg.state_offset, {seg.numel}), sg = g.slice_flat(seg.state_offset, {seg.numel});
          Tensor sm = m.slice_flat(seg.state_offset, {seg.numel}), sv = v.slice_flat(seg.state_offset, {seg.numel});
          Tensor spar = param.slice_flat(seg.param_offset, {seg.numel});
          ops::AdamWArgs a = args;
          a.weight_decay = seg.decay ? args.weight_decay : 0.0f;
          ops::adamw_step(sp, sg, sm, sv, spar, a, s);
        }
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> packed_attention_benches() {
  std::vector<OpBench> out;
  const int64_t H = kHeads, D = kHeadDim, W = 3 * H * D;
  // The 1.7B's micro-batches at seq 2048 (B 4) and 8192 (B 1): compare with
  // attention_{fwd,bwd}[_s8192]_cudnn (separate contiguous q, k, v) in attention.cpp.
  for (const std::pair<int64_t, int64_t>& shape : {std::pair<int64_t, int64_t>{4, 2048}, std::pair<int64_t, int64_t>{1, 8192}})
  for (bool backward : {false, true}) {
    const int64_t B = shape.first, S = shape.second;
    const double fwd_flops = 4.0 * B * H * S * S * D;
    OpBench b;
    const std::string suffix = S == 2048 ? "_cudnn" : "_s8192_cudnn";
    b.name = (backward ? "attention_bwd_packed" : "attention_fwd_packed") + suffix;
    b.shape = detail::concat("qkv [", B, ", ", S, ", 3 x 16 x 128] bf16");
    b.flops = backward ? 2.5 * fwd_flops : fwd_flops;
    auto args_for = [](int64_t batch, int64_t seq) {
      ops::AttentionArgs a{.batch = batch, .seq = seq, .num_heads = kHeads, .num_kv_heads = kHeads,
                           .head_dim = kHeadDim, .mask = ops::AttentionMask::None,
                           .softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim))};
      a.backend = ops::AttentionBackend::Cudnn;
      return a;
    };
    b.check = [backward, args_for](const Stream& s) {
      const int64_t bs = 1, ss = 256, w = 3 * kHeads * kHeadDim;
      ops::AttentionArgs a = args_for(bs, ss);
      Pair qkv = make_pair({bs * ss, w}, DType::BF16, s), o = make_pair({bs, ss, kHeads, kHeadDim}, DType::BF16, s);
      Pair lse = make_pair({bs, kHeads, ss}, DType::F32, s);
      ops::attention_forward_packed(qkv.dev, o.dev, lse.dev, a, s);
      ops::attention_forward_packed(qkv.host, o.host, lse.host, a, Stream::cpu());
      Check k;
      k.add(rel_err(o.dev, o.host, s), kTolBf16);
      if (backward) {
        Pair dout = make_pair({bs, ss, kHeads, kHeadDim}, DType::BF16, s), g = make_pair({bs * ss, w}, DType::BF16, s);
        Tensor od = o.host.to(s.device(), DType::BF16, s), ld = lse.host.to(s.device(), s);
        ops::attention_backward_packed(dout.dev, qkv.dev, od, ld, g.dev, a, s);
        ops::attention_backward_packed(dout.host, qkv.host, o.host, lse.host, g.host, a, Stream::cpu());
        k.add(rel_err(g.dev, g.host, s), kTolBf16);
      }
      return k;
    };
    b.setup = [backward, args_for, B, S, H, D, W](const Stream& s) -> std::function<void()> {
      const ops::AttentionArgs a = args_for(B, S);
      Tensor qkv = random_device({B * S, W}, DType::BF16, s), o = Tensor::empty({B, S, H, D}, DType::BF16, s);
      Tensor lse = Tensor::empty({B, H, S}, DType::F32, s), dout = random_device({B, S, H, D}, DType::BF16, s);
      Tensor dqkv = Tensor::empty({B * S, W}, DType::BF16, s);
      ops::attention_forward_packed(qkv, o, lse, a, s);
      return [=, &s]() mutable {
        if (backward) ops::attention_backward_packed(dout, qkv, o, lse, dqkv, a, s);
        else ops::attention_forward_packed(qkv, o, lse, a, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

}  // namespace

std::vector<OpBench> fused_benches() {
  std::vector<OpBench> all;
  for (auto&& group : {lm_head_benches(), norm_fusion_benches(), qk_benches(), swiglu_recompute_benches(),
                       adamw_multi_benches(), packed_attention_benches()})
    all.insert(all.end(), group.begin(), group.end());
  return all;
}

}  // namespace megadlm::bench
