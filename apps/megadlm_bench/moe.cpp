// MoE rows of megadlm_bench: the grouped GEMMs of the experts at the benchmark's
// fine-grained shape (configs/fine_grained_moe.args), the router top-k and the permutation by
// expert (permute, unpermute and the unpermute backward at 8192 tokens x top-8 of 64 experts x
// hidden 2048 bf16, in GB/s), each checked against the CPU op first.
#include <algorithm>
#include <numeric>
#include <random>
#include "megadlm/core/error.h"
#include "megadlm/ops/moe.h"
#include "megadlm_bench/bench.h"

namespace megadlm::bench {

namespace {

// The fine-grained MoE of the benchmark (configs/fine_grained_moe.args): 64 experts of width
// 768, top-8 of 8192 tokens: 65536 routed rows, about 1024 per expert.
constexpr int64_t kMoeExperts = 64, kMoeTopk = 8, kMoeFfn = 768;

/// A random top-k routing: each of `tokens` tokens picks k distinct experts, [tokens * k].
std::vector<int32_t> random_routing(int64_t tokens, int64_t experts, int64_t k) {
  std::mt19937 rng(static_cast<uint32_t>(++g_seed));
  std::vector<int32_t> idx(static_cast<size_t>(tokens * k)), ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t j = 0; j < k; ++j) idx[static_cast<size_t>(t * k + j)] = ids[static_cast<size_t>(j)];
  }
  return idx;
}

/// Rows per expert of a random top-k routing of `tokens` tokens.
std::vector<int64_t> moe_group_rows(int64_t tokens, int64_t experts, int64_t k) {
  std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
  for (int32_t e : random_routing(tokens, experts, k)) ++rows[static_cast<size_t>(e)];
  return rows;
}

/// The dispatch plan (moe_dispatch_plan's dest, [tokens, k] on the stream's device) of a random
/// top-k routing.
Tensor random_dispatch(int64_t tokens, int64_t k, int64_t experts, const Stream& s) {
  Tensor indices = Tensor::from_ints(random_routing(tokens, experts, k), {tokens, k}).to(s.device(), s);
  Tensor dest = Tensor::empty({tokens, k}, DType::I32, s), cnt = Tensor::empty({experts}, DType::I32, s);
  ops::moe_dispatch_plan(indices, 0, static_cast<int>(experts), dest, cnt, s);
  return dest;
}

/// One grouped GEMM of the experts: fwd Y_g = X_g W_g^T, dgrad dX_g = dY_g W_g, wgrad
/// dW_g += dY_g^T X_g (f32), with `out` x `in` expert weights.
OpBench grouped_gemm_bench(const char* name, int64_t out, int64_t in, int kind) {
  OpBench b;
  b.name = std::string("grouped_gemm_") + name;
  const int64_t rows = kTokens * kMoeTopk;
  b.shape = detail::concat(kMoeExperts, " x [~", rows / kMoeExperts, " x ", kind == 1 ? in : out, " x ",
                           kind == 1 ? out : in, "]", kind == 2 ? " +=" : "");
  b.flops = 2.0 * static_cast<double>(rows) * static_cast<double>(out) * static_cast<double>(in);
  auto run = [kind](const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& y, Tensor& dx, Tensor& dw,
                    const std::vector<int64_t>& g, const Stream& s) {
    if (kind == 0) ops::grouped_gemm(x, w, y, g, {.trans_b = true}, s);
    else if (kind == 1) ops::grouped_gemm(dy, w, dx, g, {}, s);
    else ops::grouped_gemm(dy, x, dw, g, {.trans_a = true, .beta = 1.0f}, s);
  };
  b.check = [run, kind](const Stream& s) {
    const std::vector<int64_t> g = {37, 0, 101, 64};  // an expert without tokens
    const int64_t n = 202, o = 96, i = 128;
    Pair x = make_pair({n, i}, DType::BF16, s), w = make_pair({4 * o, i}, DType::BF16, s);
    Pair dy = make_pair({n, o}, DType::BF16, s), y = make_pair({n, o}, DType::BF16, s);
    Pair dx = make_pair({n, i}, DType::BF16, s), dw = make_pair({4 * o, i}, DType::F32, s);
    run(x.dev, w.dev, dy.dev, y.dev, dx.dev, dw.dev, g, s);
    run(x.host, w.host, dy.host, y.host, dx.host, dw.host, g, Stream::cpu());
    Check c;
    if (kind == 0) c.add(rel_err(y.dev, y.host, s), kTolBf16);
    if (kind == 1) c.add(rel_err(dx.dev, dx.host, s), kTolBf16);
    if (kind == 2) c.add(rel_err(dw.dev, dw.host, s), kTolF32);
    return c;
  };
  b.setup = [run, out, in, rows](const Stream& s) -> std::function<void()> {
    const std::vector<int64_t> g = moe_group_rows(kTokens, kMoeExperts, kMoeTopk);
    Tensor x = random_device({rows, in}, DType::BF16, s), w = random_device({kMoeExperts * out, in}, DType::BF16, s);
    Tensor dy = random_device({rows, out}, DType::BF16, s), y = Tensor::empty({rows, out}, DType::BF16, s);
    Tensor dx = Tensor::empty({rows, in}, DType::BF16, s);
    Tensor dw = random_device({kMoeExperts * out, in}, DType::F32, s, -1e-3f, 1e-3f);
    return [=, &s]() mutable { run(x, w, dy, y, dx, dw, g, s); };
  };
  return b;
}

}  // namespace

std::vector<OpBench> moe_benches() {
  const int64_t H = kHidden, T = kTokens, K = kMoeTopk, E = kMoeExperts;
  std::vector<OpBench> out;
  const int64_t fc1 = 2 * kMoeFfn;  // SwiGLU: gate and up
  out.push_back(grouped_gemm_bench("fc1_fwd", fc1, H, 0));
  out.push_back(grouped_gemm_bench("fc1_dgrad", fc1, H, 1));
  out.push_back(grouped_gemm_bench("fc1_wgrad", fc1, H, 2));
  out.push_back(grouped_gemm_bench("fc2_fwd", H, kMoeFfn, 0));
  out.push_back(grouped_gemm_bench("fc2_dgrad", H, kMoeFfn, 1));
  out.push_back(grouped_gemm_bench("fc2_wgrad", H, kMoeFfn, 2));
  // Routing and the permutation (memory-bound: bytes read + written).
  OpBench r;
  r.name = "moe_router_topk_fwd";
  r.shape = detail::concat("[", T, ", ", E, "] f32 top-", K);
  r.bytes = static_cast<double>(T * E * 4 + T * K * 8);
  r.check = [](const Stream& s) {
    Pair l = make_pair({300, 64}, DType::F32, s, -4.0f, 4.0f);
    Pair p = make_pair({300, 8}, DType::F32, s);
    Tensor i_dev = Tensor::empty({300, 8}, DType::I32, s), i_host = Tensor::empty({300, 8}, DType::I32, Stream::cpu());
    ops::moe_router_topk_forward(l.dev, Tensor(), p.dev, i_dev, {.topk = 8}, s);
    ops::moe_router_topk_forward(l.host, Tensor(), p.host, i_host, {.topk = 8}, Stream::cpu());
    Check c;
    c.add(i_dev.to_ints(s) == i_host.to_ints(Stream::cpu()) ? 0.0 : 1.0, kTolF32);
    c.add(rel_err(p.dev, p.host, s), kTolF32);
    return c;
  };
  r.setup = [T, E, K](const Stream& s) -> std::function<void()> {
    Tensor l = random_device({T, E}, DType::F32, s, -4.0f, 4.0f), p = Tensor::empty({T, K}, DType::F32, s);
    Tensor i = Tensor::empty({T, K}, DType::I32, s);
    return [=, &s]() mutable { ops::moe_router_topk_forward(l, Tensor(), p, i, {.topk = static_cast<int>(K)}, s); };
  };
  out.push_back(r);
  for (const bool unpermute : {false, true}) {
    OpBench b;
    b.name = unpermute ? "moe_unpermute" : "moe_permute";
    b.shape = detail::concat("[", T, ", ", H, "] bf16 x top-", K);
    b.bytes = static_cast<double>(T * H * 2 + T * K * H * 2);
    b.check = [unpermute](const Stream& s) {
      const int64_t t = 200, h = 256;
      Pair l = make_pair({t, 16}, DType::F32, s);
      Tensor idx = Tensor::empty({t, 4}, DType::I32, Stream::cpu());
      Tensor pr = Tensor::empty({t, 4}, DType::F32, Stream::cpu());
      ops::moe_router_topk_forward(l.host, Tensor(), pr, idx, {.topk = 4}, Stream::cpu());
      Tensor dest = Tensor::empty({t, 4}, DType::I32, Stream::cpu()), cnt = Tensor::empty({16}, DType::I32, Stream::cpu());
      ops::moe_dispatch_plan(idx, 0, 16, dest, cnt, Stream::cpu());
      Tensor dest_dev = dest.to(s.device(), s), pr_dev = pr.to(s.device(), s);
      Check c;
      if (!unpermute) {
        Pair x = make_pair({t, h}, DType::BF16, s), y = make_pair({t * 4, h}, DType::BF16, s);
        ops::moe_permute(x.dev, dest_dev, y.dev, s);
        ops::moe_permute(x.host, dest, y.host, Stream::cpu());
        c.add(rel_err(y.dev, y.host, s), kTolBf16);
      } else {
        Pair y = make_pair({t * 4, h}, DType::BF16, s), o = make_pair({t, h}, DType::BF16, s);
        ops::moe_unpermute(y.dev, dest_dev, pr_dev, o.dev, s);
        ops::moe_unpermute(y.host, dest, pr, o.host, Stream::cpu());
        c.add(rel_err(o.dev, o.host, s), kTolBf16);
      }
      return c;
    };
    b.setup = [unpermute, T, H, K, E](const Stream& s) -> std::function<void()> {
      const Tensor dest = random_dispatch(T, K, E, s);
      Tensor x = random_device({T, H}, DType::BF16, s), y = random_device({T * K, H}, DType::BF16, s);
      Tensor probs = random_device({T, K}, DType::F32, s, 0.0f, 0.25f);
      return [=, &s]() mutable {
        if (unpermute) ops::moe_unpermute(y, dest, probs, x, s);
        else ops::moe_permute(x, dest, y, s);
      };
    };
    out.push_back(b);
  }
  // The combine's backward: dy of every routed row and the probs' gradients (reads dout once
  // and the k rows of y of each token, writes dy).
  OpBench ub;
  ub.name = "moe_unpermute_backward";
  ub.shape = detail::concat("[", T, ", ", H, "] bf16 x top-", K);
  ub.bytes = static_cast<double>(T * H * 2 + 2 * T * K * H * 2);
  ub.check = [](const Stream& s) {
    const int64_t t = 200, h = 256;
    Pair l = make_pair({t, 16}, DType::F32, s);
    Tensor idx = Tensor::empty({t, 4}, DType::I32, Stream::cpu());
    Tensor pr = Tensor::empty({t, 4}, DType::F32, Stream::cpu());
    ops::moe_router_topk_forward(l.host, Tensor(), pr, idx, {.topk = 4}, Stream::cpu());
    Tensor dest = Tensor::empty({t, 4}, DType::I32, Stream::cpu()), cnt = Tensor::empty({16}, DType::I32, Stream::cpu());
    ops::moe_dispatch_plan(idx, 0, 16, dest, cnt, Stream::cpu());
    Tensor dest_dev = dest.to(s.device(), s), pr_dev = pr.to(s.device(), s);
    Pair dout = make_pair({t, h}, DType::BF16, s), y = make_pair({t * 4, h}, DType::BF16, s);
    Pair dy = make_pair({t * 4, h}, DType::BF16, s), dp = make_pair({t, 4}, DType::F32, s);
    ops::moe_unpermute_backward(dout.dev, y.dev, dest_dev, pr_dev, dy.dev, dp.dev, s);
    ops::moe_unpermute_backward(dout.host, y.host, dest, pr, dy.host, dp.host, Stream::cpu());
    Check c;
    c.add(rel_err(dy.dev, dy.host, s), kTolBf16);
    c.add(rel_err(dp.dev, dp.host, s), kTolF32);  // fp32 dots of the same bf16 values: order only
    return c;
  };
  ub.setup = [T, H, K, E](const Stream& s) -> std::function<void()> {
    const Tensor dest = random_dispatch(T, K, E, s);
    Tensor dout = random_device({T, H}, DType::BF16, s), y = random_device({T * K, H}, DType::BF16, s);
    Tensor dy = Tensor::empty({T * K, H}, DType::BF16, s), dprobs = Tensor::empty({T, K}, DType::F32, s);
    Tensor probs = random_device({T, K}, DType::F32, s, 0.0f, 0.25f);
    return [=, &s]() mutable { ops::moe_unpermute_backward(dout, y, dest, probs, dy, dprobs, s); };
  };
  out.push_back(ub);
  return out;
}

}  // namespace megadlm::bench
