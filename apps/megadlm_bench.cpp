// megadlm_bench: op benchmarks on one CUDA device, through the public ops:: API only, and
// collective bandwidth over NCCL through comm::Communicator.
//
//   megadlm_bench ops [--op NAME] [--out FILE]
//   mpirun -np 2 megadlm_bench comm [--op NAME] [--out FILE]
//
// For every op (or the ones whose name contains NAME): first a small case run on CUDA and on the
// CPU reference with the same bf16-rounded inputs (PASS/FAIL with the relative L2 error), then the
// big case of the 1.7B model (T = 8192 tokens, hidden 2048, SwiGLU FFN 6144, vocabulary 50304,
// 16 heads of 128; attention at B=4, H=16, S=2048, D=128) timed with CUDA events: warm-up, then
// kReps repetitions each preceded (outside the timed region) by a write of a 256 MiB buffer so
// that no input is served from L2, median reported. Matrix ops report TFLOP/s against the
// measured bf16 GEMM ceiling, memory-bound ops GB/s (bytes each input is read once + each output
// written once) against the measured copy bandwidth. A JSON line per op goes to --out; a table is
// printed last. Exit codes: 0 all checks passed, 1 a check failed, 2 no device or bad usage.
//
// comm: all_reduce, reduce_scatter and all_gather of 1 GiB (--mib) in bf16 and f32 over the world of
// the launch (one rank per GPU), each timed with CUDA events around single calls: kCommWarmup
// calls, then kCommReps timed calls each preceded by a barrier; per call the slowest rank's time
// counts, and the median of those is reported with nccl-tests' bandwidths (docs/benchmarks.md):
// algbw = S / t, where S is the full buffer (all_reduce: the tensor; reduce_scatter: the input of
// size·n elements; all_gather: the output), and busbw = algbw · 2(n−1)/n for all_reduce,
// algbw · (n−1)/n for the other two: the rate each link must sustain, comparable across n.
// Before timing, an exact check (rank-tagged integers) must pass. Rank 0 prints and writes.
//
// The one exception to "CUDA headers only under src/": this program times with cudaEvent_t, the
// only way to time single launches of a few microseconds; nothing else here touches the runtime.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/philox.h"
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "megadlm/ops/activation.h"
#include "megadlm/ops/attention.h"
#include "megadlm/ops/cross_entropy.h"
#include "megadlm/ops/dropout.h"
#include "megadlm/ops/elementwise.h"
#include "megadlm/ops/embedding.h"
#include "megadlm/ops/gemm.h"
#include "megadlm/ops/moe.h"
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/ops/rope.h"
#if MEGADLM_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace megadlm;

// Ceilings measured on the benchmark H200 (see the task notes): cuBLASLt bf16 GEMM and a large
// device-to-device copy counting bytes read plus bytes written.
constexpr double kCeilingBf16Tflops = 811.0;
constexpr double kCeilingCopyGBps = 4300.0;

constexpr int kWarmup = 5;
constexpr int kReps = 25;
constexpr int64_t kFlushBytes = int64_t{256} << 20;  // > 50 MiB of L2, several times over

// The 1.7B model.
constexpr int64_t kTokens = 8192, kHidden = 2048, kFfn = 6144, kVocab = 50304;
constexpr int64_t kHeads = 16, kHeadDim = 128;
constexpr int64_t kParamsPerRank = 1'700'000'000 / 28;  // AdamW over one 28th of the parameters

// ---- timing ---------------------------------------------------------------------------------

#if MEGADLM_WITH_CUDA
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) MDLM_FAIL("megadlm_bench: ", what, ": ", cudaGetErrorString(e));
}

/// Median device time of fn over kReps launches, each bracketed by events on the op's stream.
double median_ms(const Stream& stream, Tensor& flush, const std::function<void()>& fn) {
  auto cs = static_cast<cudaStream_t>(stream.native());
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < kWarmup; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < kReps; ++i) {
    ops::fill(flush, static_cast<float>(i + 1), stream);  // evicts the inputs from L2
    check_cuda(cudaEventRecord(start, cs), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop, cs), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}
#else
double median_ms(const Stream&, Tensor&, const std::function<void()>&) {
  MDLM_FAIL("megadlm_bench: built without CUDA");
}
#endif

// ---- data -----------------------------------------------------------------------------------

uint64_t g_seed = 0;

std::vector<float> bf16_values(int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = std::vector<float>(static_cast<size_t>(n));
  const PhiloxKey key = PhiloxKey::make(++g_seed, RngPurpose::MockData);
  for (int64_t i = 0; i < n; ++i) {
    const float u = uniform_from_u32(philox(key, static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 0, 0).w[0]);
    v[static_cast<size_t>(i)] = round_to_bf16(lo + (hi - lo) * u);
  }
  return v;
}

/// A device tensor of random values in [lo, hi): 4 Mi host-drawn values uploaded once and
/// tiled (drawing hundreds of millions on the host would dominate the run).
Tensor random_device(const Shape& shape, DType dtype, const Stream& s, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype, s);
  const int64_t n = t.numel();
  const int64_t block = std::min<int64_t>(n, int64_t{1} << 22);
  if (n == 0) return t;
  Tensor src = Tensor::from_floats(bf16_values(block, lo, hi), {block}, dtype).to(s.device(), s);
  Tensor flat = t.view({n});
  for (int64_t off = 0; off < n; off += block) {
    const int64_t len = std::min(block, n - off);
    Tensor dst = flat.slice_flat(off, {len});
    copy_tensor(src.slice_flat(0, {len}), dst, s);
  }
  return t;
}

Tensor device_ints(const std::vector<int32_t>& v, const Stream& s) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}).to(s.device(), s);
}

std::vector<int32_t> random_ints(int64_t n, int32_t bound) {
  std::mt19937 rng(static_cast<uint32_t>(++g_seed));
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(bound));
  return v;
}

/// Same values on both sides: a host f32 tensor for the CPU op, a device tensor in `dtype`.
struct Pair {
  Tensor host, dev;
};

Pair make_pair(const Shape& shape, DType dtype, const Stream& s, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = bf16_values(shape_numel(shape), lo, hi);
  Tensor host = Tensor::from_floats(v, shape);
  return {host, Tensor::from_floats(v, shape, dtype).to(s.device(), s)};
}

/// Relative L2 error of a device result against a host f32 reference (inf on any NaN).
double rel_err(const Tensor& dev, const Tensor& host, const Stream& s) {
  const std::vector<float> a = dev.to_floats(s), b = host.to_floats(Stream::cpu());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// ---- the op table ---------------------------------------------------------------------------

constexpr double kTolBf16 = 1e-2;  // bf16 outputs vs the f32 CPU reference (tests/support/tolerances.h)
constexpr double kTolF32 = 1e-4;   // fp32 outputs (statistics, losses, weight gradients)

struct Check {
  double err = INFINITY;  ///< worst of the outputs' err / tol ratios, reported as err of that output
  double tol = 0;
  void add(double e, double t) {
    if (tol == 0 || e / t > err / tol) {
      err = e;
      tol = t;
    }
  }
  bool pass() const { return tol > 0 && err <= tol; }
};

/// Attention (forward, and with `backward` the backward too) on the device with `dev_args` and on
/// the CPU with `host_args` (the same but for the document-id tensor's device), on random q, k,
/// v of [batch, seq, heads, head_dim]. Both backwards start from the CPU forward's out and lse,
/// so that only the backward differs.
Check attention_check(const ops::AttentionArgs& dev_args, const ops::AttentionArgs& host_args,
                      bool backward, const Stream& s) {
  const ops::AttentionArgs& a = dev_args;
  const Shape qs{a.batch, a.seq, a.num_heads, a.head_dim};
  Pair q = make_pair(qs, DType::BF16, s), k = make_pair(qs, DType::BF16, s), v = make_pair(qs, DType::BF16, s);
  Pair o = make_pair(qs, DType::BF16, s), lse = make_pair({a.batch, a.num_heads, a.seq}, DType::F32, s);
  ops::attention_forward(q.dev, k.dev, v.dev, o.dev, lse.dev, dev_args, s);
  ops::attention_forward(q.host, k.host, v.host, o.host, lse.host, host_args, Stream::cpu());
  Check c;
  c.add(rel_err(o.dev, o.host, s), kTolBf16);
  c.add(rel_err(lse.dev, lse.host, s), kTolF32);
  if (backward) {
    Pair dout = make_pair(qs, DType::BF16, s);
    Pair dq = make_pair(qs, DType::BF16, s), dk = make_pair(qs, DType::BF16, s), dv = make_pair(qs, DType::BF16, s);
    Tensor o_dev = o.host.to(s.device(), DType::BF16, s), lse_dev = lse.host.to(s.device(), s);
    ops::attention_backward(dout.dev, q.dev, k.dev, v.dev, o_dev, lse_dev, dq.dev, dk.dev, dv.dev, dev_args, s);
    ops::attention_backward(dout.host, q.host, k.host, v.host, o.host, lse.host, dq.host, dk.host, dv.host,
                            host_args, Stream::cpu());
    c.add(rel_err(dq.dev, dq.host, s), kTolBf16);
    c.add(rel_err(dk.dev, dk.host, s), kTolBf16);
    c.add(rel_err(dv.dev, dv.host, s), kTolBf16);
  }
  return c;
}

struct OpBench {
  std::string name;
  std::string shape;  ///< the timed case, for the table
  double flops = 0;   ///< per call, matrix ops
  double bytes = 0;   ///< per call, memory-bound ops
  std::function<Check(const Stream&)> check;
  /// Allocates the big case and returns the call to time.
  std::function<std::function<void()>(const Stream&)> setup;
};

struct GemmShape {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  DType c;
  float beta;
};

OpBench gemm_bench(const GemmShape& g) {
  OpBench b;
  b.name = std::string("gemm_") + g.name;
  b.shape = detail::concat(g.m, "x", g.n, "x", g.k, g.ta ? " A^T" : "", g.tb ? " B^T" : "", " bf16->",
                           dtype_name(g.c), g.beta != 0 ? " +=" : "");
  b.flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  b.check = [g](const Stream& s) {
    const int64_t m = 192, n = 320, k = 256;
    Pair a = make_pair(g.ta ? Shape{k, m} : Shape{m, k}, DType::BF16, s);
    Pair bb = make_pair(g.tb ? Shape{n, k} : Shape{k, n}, DType::BF16, s);
    Pair c = make_pair({m, n}, g.c, s);
    const ops::GemmArgs args{.trans_a = g.ta, .trans_b = g.tb, .beta = g.beta};
    ops::gemm(a.dev, bb.dev, c.dev, args, s);
    ops::gemm(a.host, bb.host, c.host, args, Stream::cpu());
    Check r;
    r.add(rel_err(c.dev, c.host, s), g.c == DType::BF16 ? kTolBf16 : kTolF32);
    return r;
  };
  b.setup = [g](const Stream& s) -> std::function<void()> {
    Tensor a = random_device(g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, DType::BF16, s);
    Tensor bb = random_device(g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, DType::BF16, s);
    Tensor c = random_device({g.m, g.n}, g.c, s, -1e-3f, 1e-3f);
    const ops::GemmArgs args{.trans_a = g.ta, .trans_b = g.tb, .beta = g.beta};
    return [a, bb, c, args, &s]() mutable { ops::gemm(a, bb, c, args, s); };
  };
  return b;
}

std::vector<OpBench> gemm_benches() {
  const int64_t T = kTokens, H = kHidden, QKV = 3 * kHidden, F1 = 2 * kFfn, F2 = kFfn, V = kVocab;
  // Weights are stored [out, in] (Megatron): forward Y = X W^T, dgrad dX = dY W, wgrad dW += dY^T X.
  const GemmShape shapes[] = {
      {"qkv_fwd", T, QKV, H, false, true, DType::BF16, 0},  {"qkv_dgrad", T, H, QKV, false, false, DType::BF16, 0},
      {"qkv_wgrad", QKV, H, T, true, false, DType::F32, 1},  {"proj_fwd", T, H, H, false, true, DType::BF16, 0},
      {"proj_dgrad", T, H, H, false, false, DType::BF16, 0}, {"proj_wgrad", H, H, T, true, false, DType::F32, 1},
      {"fc1_fwd", T, F1, H, false, true, DType::BF16, 0},    {"fc1_dgrad", T, H, F1, false, false, DType::BF16, 0},
      {"fc1_wgrad", F1, H, T, true, false, DType::F32, 1},   {"fc2_fwd", T, H, F2, false, true, DType::BF16, 0},
      {"fc2_dgrad", T, F2, H, false, false, DType::BF16, 0}, {"fc2_wgrad", H, F2, T, true, false, DType::F32, 1},
      {"logits_fwd", T, V, H, false, true, DType::BF16, 0},  {"logits_dgrad", T, H, V, false, false, DType::BF16, 0},
      {"logits_wgrad", V, H, T, true, false, DType::F32, 1},
      {"square_4096", 4096, 4096, 4096, false, false, DType::BF16, 0}};
  std::vector<OpBench> out;
  for (const GemmShape& g : shapes) out.push_back(gemm_bench(g));
  return out;
}

std::vector<OpBench> norm_benches() {
  const int64_t T = kTokens, H = kHidden;
  const double act = static_cast<double>(T * H) * 2;  // one bf16 [T, H] tensor
  std::vector<OpBench> out;
  const float eps = 1e-5f;
  for (bool layer : {false, true}) {
    const std::string fam = layer ? "layer_norm" : "rms_norm";
    OpBench f;
    f.name = fam + "_fwd";
    f.shape = "[8192, 2048] bf16";
    f.bytes = 2 * act + (layer ? 4.0 : 2.0) * H + (layer ? 8.0 : 4.0) * T;
    f.check = [layer, eps](const Stream& s) {
      const int64_t r = 301, c = 2048;
      Pair x = make_pair({r, c}, DType::BF16, s), w = make_pair({c}, DType::BF16, s, 0.5f, 1.5f);
      Pair b = make_pair({c}, DType::BF16, s), y = make_pair({r, c}, DType::BF16, s);
      Pair mean = make_pair({r}, DType::F32, s), rstd = make_pair({r}, DType::F32, s);
      if (layer) {
        ops::layer_norm_forward(x.dev, w.dev, b.dev, y.dev, mean.dev, rstd.dev, eps, s);
        ops::layer_norm_forward(x.host, w.host, b.host, y.host, mean.host, rstd.host, eps, Stream::cpu());
      } else {
        ops::rms_norm_forward(x.dev, w.dev, y.dev, rstd.dev, eps, s);
        ops::rms_norm_forward(x.host, w.host, y.host, rstd.host, eps, Stream::cpu());
      }
      Check k;
      k.add(rel_err(y.dev, y.host, s), kTolBf16);
      k.add(rel_err(rstd.dev, rstd.host, s), kTolF32);
      return k;
    };
    f.setup = [layer, eps, T, H](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, H}, DType::BF16, s), w = random_device({H}, DType::BF16, s);
      Tensor b = random_device({H}, DType::BF16, s), y = Tensor::empty({T, H}, DType::BF16, s);
      Tensor mean = Tensor::empty({T}, DType::F32, s), rstd = Tensor::empty({T}, DType::F32, s);
      return [=, &s]() mutable {
        if (layer) ops::layer_norm_forward(x, w, b, y, mean, rstd, eps, s);
        else ops::rms_norm_forward(x, w, y, rstd, eps, s);
      };
    };
    out.push_back(f);

    OpBench g;
    g.name = fam + "_bwd";
    g.shape = "[8192, 2048] bf16";
    g.bytes = 3 * act + 2.0 * H + (layer ? 8.0 : 4.0) * T + (layer ? 16.0 : 8.0) * H;
    g.check = [layer](const Stream& s) {
      const int64_t r = 301, c = 2048;
      Pair x = make_pair({r, c}, DType::BF16, s), w = make_pair({c}, DType::BF16, s, 0.5f, 1.5f);
      Pair dy = make_pair({r, c}, DType::BF16, s), dx = make_pair({r, c}, DType::BF16, s);
      Pair mean = make_pair({r}, DType::F32, s, -0.1f, 0.1f), rstd = make_pair({r}, DType::F32, s, 0.5f, 2.0f);
      Pair dw = make_pair({c}, DType::F32, s), db = make_pair({c}, DType::F32, s);
      if (layer) {
        ops::layer_norm_backward(dy.dev, x.dev, w.dev, mean.dev, rstd.dev, dx.dev, dw.dev, db.dev, s);
        ops::layer_norm_backward(dy.host, x.host, w.host, mean.host, rstd.host, dx.host, dw.host,
                                 db.host, Stream::cpu());
      } else {
        ops::rms_norm_backward(dy.dev, x.dev, w.dev, rstd.dev, dx.dev, dw.dev, s);
        ops::rms_norm_backward(dy.host, x.host, w.host, rstd.host, dx.host, dw.host, Stream::cpu());
      }
      Check k;
      k.add(rel_err(dx.dev, dx.host, s), kTolBf16);
      k.add(rel_err(dw.dev, dw.host, s), kTolF32);
      if (layer) k.add(rel_err(db.dev, db.host, s), kTolF32);
      return k;
    };
    g.setup = [layer, T, H](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, H}, DType::BF16, s), w = random_device({H}, DType::BF16, s);
      Tensor dy = random_device({T, H}, DType::BF16, s), dx = Tensor::empty({T, H}, DType::BF16, s);
      Tensor mean = random_device({T}, DType::F32, s, -0.1f, 0.1f);
      Tensor rstd = random_device({T}, DType::F32, s, 0.5f, 2.0f);
      Tensor dw = Tensor::zeros({H}, DType::F32, s), db = Tensor::zeros({H}, DType::F32, s);
      return [=, &s]() mutable {
        if (layer) ops::layer_norm_backward(dy, x, w, mean, rstd, dx, dw, db, s);
        else ops::rms_norm_backward(dy, x, w, rstd, dx, dw, s);
      };
    };
    out.push_back(g);
  }
  return out;
}

std::vector<OpBench> rope_benches() {
  std::vector<OpBench> out;
  const ops::RopeArgs args{.heads = kHeads, .head_dim = kHeadDim, .rotary_dim = kHeadDim};
  for (bool backward : {false, true}) {
    OpBench b;
    b.name = backward ? "rope_bwd" : "rope_fwd";
    b.shape = "q [8192, 16, 128] bf16, in place";
    b.bytes = 2.0 * kTokens * kHeads * kHeadDim * 2 + 4.0 * kTokens;
    b.check = [args, backward](const Stream& s) {
      const int64_t t = 97;
      Pair x = make_pair({t, kHeads, kHeadDim}, DType::BF16, s);
      const std::vector<int32_t> pos = random_ints(t, 8192);
      Tensor ph = Tensor::from_ints(pos, {t}), pd = device_ints(pos, s);
      if (backward) {
        ops::rope_backward(x.dev, pd, args, s);
        ops::rope_backward(x.host, ph, args, Stream::cpu());
      } else {
        ops::rope_forward(x.dev, pd, args, s);
        ops::rope_forward(x.host, ph, args, Stream::cpu());
      }
      Check k;
      k.add(rel_err(x.dev, x.host, s), kTolBf16);
      return k;
    };
    b.setup = [args, backward](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({kTokens, kHeads, kHeadDim}, DType::BF16, s);
      std::vector<int32_t> pos(static_cast<size_t>(kTokens));
      for (int64_t t = 0; t < kTokens; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(t % 2048);
      Tensor p = device_ints(pos, s);
      return [=, &s]() mutable {
        if (backward) ops::rope_backward(x, p, args, s);
        else ops::rope_forward(x, p, args, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> activation_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, F = kFfn;
  for (bool backward : {false, true}) {
    OpBench b;
    b.name = backward ? "swiglu_bwd" : "swiglu_fwd";
    b.shape = "[8192, 12288] -> [8192, 6144] bf16";
    b.bytes = backward ? 2.0 * (T * F + 2 * T * 2 * F) : 2.0 * (T * 2 * F + T * F);
    b.check = [backward](const Stream& s) {
      const int64_t r = 77, f = 1536;
      Pair x = make_pair({r, 2 * f}, DType::BF16, s, -4, 4);
      Check k;
      if (backward) {
        Pair dy = make_pair({r, f}, DType::BF16, s), dx = make_pair({r, 2 * f}, DType::BF16, s);
        ops::swiglu_backward(dy.dev, x.dev, dx.dev, s);
        ops::swiglu_backward(dy.host, x.host, dx.host, Stream::cpu());
        k.add(rel_err(dx.dev, dx.host, s), kTolBf16);
      } else {
        Pair y = make_pair({r, f}, DType::BF16, s);
        ops::swiglu_forward(x.dev, y.dev, s);
        ops::swiglu_forward(x.host, y.host, Stream::cpu());
        k.add(rel_err(y.dev, y.host, s), kTolBf16);
      }
      return k;
    };
    b.setup = [backward, T, F](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, 2 * F}, DType::BF16, s, -4, 4);
      Tensor y = Tensor::empty({T, F}, DType::BF16, s);
      Tensor dy = random_device({T, F}, DType::BF16, s), dx = Tensor::empty({T, 2 * F}, DType::BF16, s);
      return [=, &s]() mutable {
        if (backward) ops::swiglu_backward(dy, x, dx, s);
        else ops::swiglu_forward(x, y, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> cross_entropy_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, V = kVocab;
  for (bool backward : {false, true}) {
    OpBench b;
    b.name = backward ? "cross_entropy_fwd_bwd" : "cross_entropy_fwd";
    b.shape = "[8192, 50304] bf16";
    b.bytes = (backward ? 4.0 : 2.0) * T * V + 12.0 * T;
    b.check = [backward](const Stream& s) {
      const int64_t t = 33, v = 50304;
      Pair logits = make_pair({t, v}, DType::BF16, s, -8, 8);
      const std::vector<int32_t> tg = random_ints(t, static_cast<int32_t>(v));
      Tensor th = Tensor::from_ints(tg, {t}), td = device_ints(tg, s);
      Pair losses = make_pair({t}, DType::F32, s), w = make_pair({t}, DType::F32, s, 0, 1);
      Check k;
      if (backward) {
        ops::cross_entropy_forward_backward(logits.dev, td, w.dev, losses.dev, 0.5f, s);
        ops::cross_entropy_forward_backward(logits.host, th, w.host, losses.host, 0.5f, Stream::cpu());
        k.add(rel_err(logits.dev, logits.host, s), kTolBf16);
      } else {
        ops::cross_entropy_forward(logits.dev, td, losses.dev, s);
        ops::cross_entropy_forward(logits.host, th, losses.host, Stream::cpu());
      }
      k.add(rel_err(losses.dev, losses.host, s), kTolF32);
      return k;
    };
    b.setup = [backward, T, V](const Stream& s) -> std::function<void()> {
      Tensor logits = random_device({T, V}, DType::BF16, s, -8, 8);
      Tensor targets = device_ints(random_ints(T, static_cast<int32_t>(V)), s);
      Tensor w = random_device({T}, DType::F32, s, 0, 1), losses = Tensor::empty({T}, DType::F32, s);
      return [=, &s]() mutable {
        if (backward) ops::cross_entropy_forward_backward(logits, targets, w, losses, 1.0f / T, s);
        else ops::cross_entropy_forward(logits, targets, losses, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

/// The vocab-parallel cross-entropy ops on one TP-2 rank's shard: columns [25152, 50304) of the
/// 1.7B model's logits (vocab_start != 0; about half the targets fall in the shard).
std::vector<OpBench> cross_entropy_shard_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, Vl = kVocab / 2, start = kVocab - kVocab / 2;
  const double pass = 2.0 * T * Vl;  // one read of the bf16 shard
  const char* names[] = {"ce_shard_max", "ce_shard_stats", "ce_shard_finish"};
  for (int op = 0; op < 3; ++op) {
    OpBench b;
    b.name = names[op];
    b.shape = op == 2 ? "[8192, 25152] bf16, in place" : "[8192, 25152] bf16";
    // max: shard + row_max; stats: + targets, row_max, sum_exp, target_logit; finish: shard read
    // and written + targets, three statistics, weights, losses.
    b.bytes = op == 0 ? pass + 4.0 * T : op == 1 ? pass + 16.0 * T : 2 * pass + 24.0 * T;
    b.check = [op, Vl, start](const Stream& s) {
      const int64_t t = 33;
      Pair logits = make_pair({t, Vl}, DType::BF16, s, -8, 8);
      const std::vector<int32_t> tg = random_ints(t, static_cast<int32_t>(kVocab));
      Tensor th = Tensor::from_ints(tg, {t}), td = device_ints(tg, s);
      Pair row_max = make_pair({t}, DType::F32, s), sum_exp = make_pair({t}, DType::F32, s);
      Pair target = make_pair({t}, DType::F32, s), losses = make_pair({t}, DType::F32, s);
      Pair w = make_pair({t}, DType::F32, s, 0, 1);
      // The shard's own statistics stand in for the all-reduced ones.
      Check k;
      ops::cross_entropy_shard_max(logits.dev, row_max.dev, s);
      ops::cross_entropy_shard_max(logits.host, row_max.host, Stream::cpu());
      k.add(rel_err(row_max.dev, row_max.host, s), kTolF32);
      if (op == 0) return k;
      ops::cross_entropy_shard_stats(logits.dev, td, start, row_max.dev, sum_exp.dev, target.dev, s);
      ops::cross_entropy_shard_stats(logits.host, th, start, row_max.host, sum_exp.host, target.host,
                                     Stream::cpu());
      k.add(rel_err(sum_exp.dev, sum_exp.host, s), kTolF32);
      k.add(rel_err(target.dev, target.host, s), kTolF32);
      if (op == 1) return k;
      ops::cross_entropy_shard_finish(logits.dev, td, start, row_max.dev, sum_exp.dev, target.dev,
                                      w.dev, losses.dev, 0.5f, s);
      ops::cross_entropy_shard_finish(logits.host, th, start, row_max.host, sum_exp.host,
                                      target.host, w.host, losses.host, 0.5f, Stream::cpu());
      k.add(rel_err(losses.dev, losses.host, s), kTolF32);
      k.add(rel_err(logits.dev, logits.host, s), kTolBf16);
      return k;
    };
    b.setup = [op, T, Vl, start](const Stream& s) -> std::function<void()> {
      Tensor logits = random_device({T, Vl}, DType::BF16, s, -8, 8);
      Tensor targets = device_ints(random_ints(T, static_cast<int32_t>(kVocab)), s);
      Tensor row_max = Tensor::empty({T}, DType::F32, s), sum_exp = Tensor::empty({T}, DType::F32, s);
      Tensor target = Tensor::empty({T}, DType::F32, s), losses = Tensor::empty({T}, DType::F32, s);
      Tensor w = random_device({T}, DType::F32, s, 0, 1);
      // Valid statistics for the timed stats/finish calls (finish then rewrites its own output:
      // the values change after the first call, the traffic does not).
      ops::cross_entropy_shard_max(logits, row_max, s);
      ops::cross_entropy_shard_stats(logits, targets, start, row_max, sum_exp, target, s);
      return [=, &s]() mutable {
        if (op == 0) ops::cross_entropy_shard_max(logits, row_max, s);
        else if (op == 1) ops::cross_entropy_shard_stats(logits, targets, start, row_max, sum_exp, target, s);
        else ops::cross_entropy_shard_finish(logits, targets, start, row_max, sum_exp, target, w, losses,
                                             1.0f / T, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> optimizer_benches() {
  OpBench b;
  b.name = "adamw";
  b.shape = "1.7e9/28 f32 + bf16 param";
  b.bytes = static_cast<double>(kParamsPerRank) * (4 * 4 + 3 * 4 + 2);
  const ops::AdamWArgs args{.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f, .step = 10};
  b.check = [args](const Stream& s) {
    const int64_t n = 100003;
    Pair p = make_pair({n}, DType::F32, s), g = make_pair({n}, DType::F32, s, -1e-2f, 1e-2f);
    Pair m = make_pair({n}, DType::F32, s, -1e-3f, 1e-3f), v = make_pair({n}, DType::F32, s, 0, 1e-5f);
    Pair param = make_pair({n}, DType::BF16, s);
    ops::adamw_step(p.dev, g.dev, m.dev, v.dev, param.dev, args, s);
    ops::adamw_step(p.host, g.host, m.host, v.host, param.host, args, Stream::cpu());
    Check k;
    k.add(rel_err(p.dev, p.host, s), 1e-6);
    k.add(rel_err(v.dev, v.host, s), 1e-6);
    k.add(rel_err(param.dev, param.host, s), kTolBf16);
    return k;
  };
  b.setup = [args](const Stream& s) -> std::function<void()> {
    const int64_t n = kParamsPerRank;
    Tensor p = random_device({n}, DType::F32, s), g = random_device({n}, DType::F32, s, -1e-2f, 1e-2f);
    Tensor m = random_device({n}, DType::F32, s, -1e-3f, 1e-3f), v = random_device({n}, DType::F32, s, 0, 1e-5f);
    Tensor param = Tensor::empty({n}, DType::BF16, s);
    return [=, &s]() mutable { ops::adamw_step(p, g, m, v, param, args, s); };
  };
  return {b};
}

std::vector<OpBench> embedding_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, H = kHidden, V = kVocab;
  const std::vector<int32_t> ids = random_ints(T, static_cast<int32_t>(V));
  const double unique = static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
  for (bool backward : {false, true}) {
    OpBench b;
    b.name = backward ? "embedding_bwd" : "embedding_fwd";
    b.shape = "ids [8192] x [50304, 2048] bf16";
    b.bytes = backward ? 2.0 * T * H + 8.0 * unique * H + 4.0 * T : 4.0 * T * H + 4.0 * T;
    b.check = [backward](const Stream& s) {
      const int64_t t = 2000, v = 500, h = 256;
      const std::vector<int32_t> small = random_ints(t, static_cast<int32_t>(v));
      Tensor ih = Tensor::from_ints(small, {t}), id = device_ints(small, s);
      Check k;
      if (backward) {
        Pair dout = make_pair({t, h}, DType::BF16, s), dw = make_pair({v, h}, DType::F32, s);
        ops::embedding_backward(id, dout.dev, dw.dev, 0, s);
        ops::embedding_backward(ih, dout.host, dw.host, 0, Stream::cpu());
        k.add(rel_err(dw.dev, dw.host, s), kTolF32);
      } else {
        Pair w = make_pair({v, h}, DType::BF16, s), o = make_pair({t, h}, DType::BF16, s);
        ops::embedding_forward(w.dev, id, o.dev, 0, s);
        ops::embedding_forward(w.host, ih, o.host, 0, Stream::cpu());
        k.add(rel_err(o.dev, o.host, s), kTolBf16);
      }
      return k;
    };
    b.setup = [backward, ids, T, H, V](const Stream& s) -> std::function<void()> {
      Tensor id = device_ints(ids, s);
      if (backward) {
        Tensor dout = random_device({T, H}, DType::BF16, s), dw = Tensor::zeros({V, H}, DType::F32, s);
        return [=, &s]() mutable { ops::embedding_backward(id, dout, dw, 0, s); };
      }
      Tensor w = random_device({V, H}, DType::BF16, s), o = Tensor::empty({T, H}, DType::BF16, s);
      return [=, &s]() mutable { ops::embedding_forward(w, id, o, 0, s); };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> elementwise_benches() {
  std::vector<OpBench> out;
  const int64_t T = kTokens, H = kHidden;
  const double act = 2.0 * T * H;
  {
    OpBench b;
    b.name = "dropout_add_fwd";
    b.shape = "[8192, 2048] bf16 p=0.1";
    b.bytes = 3 * act;
    const ops::DropoutArgs args{.p = 0.1f, .seed = 5, .site = 1, .seq_len = 2048};
    b.check = [args](const Stream& s) {
      Pair x = make_pair({300, 2048}, DType::BF16, s), r = make_pair({300, 2048}, DType::BF16, s);
      Pair o = make_pair({300, 2048}, DType::BF16, s);
      ops::dropout_add_forward(x.dev, r.dev, o.dev, args, s);
      ops::dropout_add_forward(x.host, r.host, o.host, args, Stream::cpu());
      Check k;
      k.add(rel_err(o.dev, o.host, s), kTolBf16);
      return k;
    };
    b.setup = [args, T, H](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, H}, DType::BF16, s), r = random_device({T, H}, DType::BF16, s);
      Tensor o = Tensor::empty({T, H}, DType::BF16, s);
      return [=, &s]() mutable { ops::dropout_add_forward(x, r, o, args, s); };
    };
    out.push_back(b);
  }
  {
    OpBench b;
    b.name = "add";
    b.shape = "[8192, 2048] bf16";
    b.bytes = 3 * act;
    b.check = [](const Stream& s) {
      Pair x = make_pair({1000, 333}, DType::BF16, s), y = make_pair({1000, 333}, DType::BF16, s);
      Pair o = make_pair({1000, 333}, DType::BF16, s);
      ops::add(x.dev, y.dev, o.dev, s);
      ops::add(x.host, y.host, o.host, Stream::cpu());
      Check k;
      k.add(rel_err(o.dev, o.host, s), kTolBf16);
      return k;
    };
    b.setup = [T, H](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({T, H}, DType::BF16, s), y = random_device({T, H}, DType::BF16, s);
      Tensor o = Tensor::empty({T, H}, DType::BF16, s);
      return [=, &s]() mutable { ops::add(x, y, o, s); };
    };
    out.push_back(b);
  }
  {
    OpBench b;
    b.name = "sum_squares";
    b.shape = "1.7e9/28 f32 (grad norm)";
    b.bytes = 4.0 * kParamsPerRank;
    b.check = [](const Stream& s) {
      Pair x = make_pair({1000003}, DType::F32, s), o = make_pair({1}, DType::F32, s);
      ops::sum_squares(x.dev, o.dev, s);
      ops::sum_squares(x.host, o.host, Stream::cpu());
      Check k;
      k.add(rel_err(o.dev, o.host, s), kTolF32);
      return k;
    };
    b.setup = [](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({kParamsPerRank}, DType::F32, s), o = Tensor::zeros({1}, DType::F32, s);
      return [=, &s]() mutable { ops::sum_squares(x, o, s); };
    };
    out.push_back(b);
  }
  {
    OpBench b;
    b.name = "copy_f32_to_bf16";
    b.shape = "1.7e9/28 (master -> param)";
    b.bytes = 6.0 * kParamsPerRank;
    b.check = [](const Stream& s) {
      Pair x = make_pair({100003}, DType::F32, s), o = make_pair({100003}, DType::BF16, s);
      ops::copy(x.dev, o.dev, s);
      Check k;
      k.add(rel_err(o.dev, x.host, s), kTolBf16);
      return k;
    };
    b.setup = [](const Stream& s) -> std::function<void()> {
      Tensor x = random_device({kParamsPerRank}, DType::F32, s);
      Tensor o = Tensor::empty({kParamsPerRank}, DType::BF16, s);
      return [=, &s]() mutable { ops::copy(x, o, s); };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> attention_benches() {
  std::vector<OpBench> out;
  const int64_t B = 4, H = 16, S = 2048, D = 128;
  // Attention dropout (Megatron's default p = 0.1) as separate rows: same flops, the difference in
  // time is the cost of drawing the mask (forward) and redrawing it (backward).
  for (float dropout : {0.0f, 0.1f}) {
    for (ops::AttentionMask mask : {ops::AttentionMask::None, ops::AttentionMask::Causal}) {
      const bool causal = mask == ops::AttentionMask::Causal;
      // Two matrix products of 2*S*S*D flops per head forward, five backward (2.5x); causal halves.
      const double fwd_flops = 4.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
      for (bool backward : {false, true}) {
        OpBench b;
        b.name = detail::concat("attention_", backward ? "bwd" : "fwd", causal ? "_causal" : "",
                                dropout > 0 ? "_dropout" : "");
        b.shape = dropout > 0 ? "B=4 H=16 S=2048 D=128 bf16 p=0.1" : "B=4 H=16 S=2048 D=128 bf16";
        b.flops = backward ? 2.5 * fwd_flops : fwd_flops;
        b.check = [mask, backward, dropout](const Stream& s) {
          const int64_t ss = 128, ds = 128;
          const ops::AttentionArgs a{.batch = 1, .seq = ss, .num_heads = 2, .num_kv_heads = 2,
                                     .head_dim = ds, .mask = mask,
                                     .softmax_scale = 1.0f / std::sqrt(static_cast<float>(ds)),
                                     .dropout_p = dropout, .dropout_seed = 9, .dropout_site = 1};
          return attention_check(a, a, backward, s);
        };
        b.setup = [mask, backward, dropout](const Stream& s) -> std::function<void()> {
          const ops::AttentionArgs a{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = H,
                                     .head_dim = D, .mask = mask,
                                     .softmax_scale = 1.0f / std::sqrt(static_cast<float>(D)),
                                     .dropout_p = dropout, .dropout_seed = 9, .dropout_site = 1};
          const Shape qs{B, S, H, D};
          Tensor q = random_device(qs, DType::BF16, s), k = random_device(qs, DType::BF16, s);
          Tensor v = random_device(qs, DType::BF16, s), o = Tensor::empty(qs, DType::BF16, s);
          Tensor lse = Tensor::empty({B, H, S}, DType::F32, s);
          ops::attention_forward(q, k, v, o, lse, a, s);  // the saved out/lse backward reads
          Tensor dout = random_device(qs, DType::BF16, s), dq = Tensor::empty(qs, DType::BF16, s);
          Tensor dk = Tensor::empty(qs, DType::BF16, s), dv = Tensor::empty(qs, DType::BF16, s);
          return [=, &s]() mutable {
            if (backward) ops::attention_backward(dout, q, k, v, o, lse, dq, dk, dv, a, s);
            else ops::attention_forward(q, k, v, o, lse, a, s);
          };
        };
        out.push_back(b);
      }
    }
  }
  // Packed rows (per-document attention, --reset-attention-mask): documents of 180..332 tokens
  // (mean ~256) on the flash kernels, no mask. The flops count only the products inside
  // documents (4 D per visible (query, key) pair forward, 2.5x backward), so the rate compares
  // with the dense attention_fwd / attention_bwd rows; work the kernels spend on masked elements
  // of tiles that straddle documents does not count.
  {
    const std::vector<int> lengths = {256, 200, 312, 256, 180, 332};
    auto packed = [lengths](int64_t batch, int64_t seq) {
      std::vector<int32_t> ids;
      double pairs = 0;  // sum over rows and documents of length^2
      for (int64_t b = 0; b < batch; ++b) {
        int32_t doc = 0;
        int64_t i = 0;
        while (i < seq) {
          const int64_t len = std::min<int64_t>(lengths[(b + doc) % lengths.size()], seq - i);
          for (int64_t j = 0; j < len; ++j) ids.push_back(doc);
          pairs += static_cast<double>(len) * static_cast<double>(len);
          i += len;
          ++doc;
        }
      }
      return std::make_pair(ids, pairs);
    };
    const auto [ids, pairs] = packed(B, S);
    const double fwd_flops = 4.0 * H * D * pairs;
    for (bool backward : {false, true}) {
      OpBench b;
      b.name = detail::concat("attention_", backward ? "bwd" : "fwd", "_documents");
      b.shape = "B=4 H=16 S=2048 D=128 bf16, docs ~256";
      b.flops = backward ? 2.5 * fwd_flops : fwd_flops;
      b.check = [backward, packed](const Stream& s) {
        const int64_t bs = 2, ss = 333, ds = 128;  // two documents a row, ragged end
        const std::vector<int32_t> small = packed(bs, ss).first;
        Tensor doc_host = Tensor::from_ints(small, {bs, ss}), doc_dev = device_ints(small, s);
        ops::AttentionArgs a{.batch = bs, .seq = ss, .num_heads = 2, .num_kv_heads = 2,
                             .head_dim = ds, .mask = ops::AttentionMask::None,
                             .softmax_scale = 1.0f / std::sqrt(static_cast<float>(ds))};
        ops::AttentionArgs a_host = a;
        a.document_ids = &doc_dev;
        a_host.document_ids = &doc_host;
        return attention_check(a, a_host, backward, s);
      };
      b.setup = [backward, ids = ids](const Stream& s) -> std::function<void()> {
        const Shape qs{B, S, H, D};
        Tensor docs = device_ints(ids, s);
        ops::AttentionArgs a{.batch = B, .seq = S, .num_heads = H, .num_kv_heads = H,
                             .head_dim = D, .mask = ops::AttentionMask::None,
                             .softmax_scale = 1.0f / std::sqrt(static_cast<float>(D))};
        a.document_ids = &docs;
        Tensor q = random_device(qs, DType::BF16, s), k = random_device(qs, DType::BF16, s);
        Tensor v = random_device(qs, DType::BF16, s), o = Tensor::empty(qs, DType::BF16, s);
        Tensor lse = Tensor::empty({B, H, S}, DType::F32, s);
        ops::attention_forward(q, k, v, o, lse, a, s);  // the saved out/lse backward reads
        Tensor dout = random_device(qs, DType::BF16, s), dq = Tensor::empty(qs, DType::BF16, s);
        Tensor dk = Tensor::empty(qs, DType::BF16, s), dv = Tensor::empty(qs, DType::BF16, s);
        // a points at the closure's own copy of docs (a local here would dangle).
        return [=, &s]() mutable {
          a.document_ids = &docs;
          if (backward) ops::attention_backward(dout, q, k, v, o, lse, dq, dk, dv, a, s);
          else ops::attention_forward(q, k, v, o, lse, a, s);
        };
      };
      out.push_back(b);
    }
  }
  return out;
}

// The fine-grained MoE of the benchmark (configs/fine_grained_moe.args): 64 experts of width
// 768, top-8 of 8192 tokens: 65536 routed rows, about 1024 per expert.
constexpr int64_t kMoeExperts = 64, kMoeTopk = 8, kMoeFfn = 768;

/// Rows per expert of a random top-8 routing of kTokens tokens (each token 8 distinct experts).
std::vector<int64_t> moe_group_rows(int64_t tokens, int64_t experts, int64_t k) {
  std::mt19937 rng(static_cast<uint32_t>(++g_seed));
  std::vector<int64_t> rows(static_cast<size_t>(experts), 0);
  std::vector<int> ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t j = 0; j < k; ++j) ++rows[static_cast<size_t>(ids[static_cast<size_t>(j)])];
  }
  return rows;
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
      std::vector<int32_t> idx(static_cast<size_t>(T * K));
      std::mt19937 rng(static_cast<uint32_t>(++g_seed));
      std::vector<int32_t> ids(static_cast<size_t>(E));
      for (int64_t t = 0; t < T; ++t) {
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        for (int64_t j = 0; j < K; ++j) idx[static_cast<size_t>(t * K + j)] = ids[static_cast<size_t>(j)];
      }
      Tensor indices = Tensor::from_ints(idx, {T, K}).to(s.device(), s);
      Tensor dest = Tensor::empty({T, K}, DType::I32, s), cnt = Tensor::empty({E}, DType::I32, s);
      ops::moe_dispatch_plan(indices, 0, static_cast<int>(E), dest, cnt, s);
      Tensor x = random_device({T, H}, DType::BF16, s), y = random_device({T * K, H}, DType::BF16, s);
      Tensor probs = random_device({T, K}, DType::F32, s, 0.0f, 0.25f);
      return [=, &s]() mutable {
        if (unpermute) ops::moe_unpermute(y, dest, probs, x, s);
        else ops::moe_permute(x, dest, y, s);
      };
    };
    out.push_back(b);
  }
  return out;
}

std::vector<OpBench> all_benches() {
  std::vector<OpBench> all;
  for (auto&& group : {gemm_benches(), norm_benches(), rope_benches(), activation_benches(),
                       cross_entropy_benches(), cross_entropy_shard_benches(), optimizer_benches(),
                       embedding_benches(), elementwise_benches(), attention_benches(), moe_benches()})
    all.insert(all.end(), group.begin(), group.end());
  return all;
}

// ---- driver ---------------------------------------------------------------------------------

struct Result {
  std::string name, shape, check = "ERROR", note;
  double err = NAN, tol = NAN, ms = NAN, rate = NAN, pct = NAN;
  bool matrix = false;
};

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s ops [--op NAME] [--out FILE]\n"
                       "       mpirun -np N %s comm [--op NAME] [--mib SIZE (1024)] [--out FILE]\n"
                       "  --op NAME  only the ops (or collectives) whose name contains NAME\n"
                       "             (e.g. gemm, rms_norm_bwd, all_reduce)\n"
                       "  --out FILE append one JSON line per op or collective to FILE\n", argv0, argv0);
  return 2;
}

int run_comm(int argc, char** argv);

int run(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "comm") == 0) return run_comm(argc, argv);
  if (argc < 2 || std::strcmp(argv[1], "ops") != 0) return usage(argv[0]);
  std::string filter, out_path;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--op") == 0 && i + 1 < argc) filter = argv[++i];
    else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
    else return usage(argv[0]);
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "megadlm_bench: no CUDA device visible\n");
    return 2;
  }
  g_seed = std::random_device{}();
  std::printf("megadlm_bench ops: seed %llu, %d warm-up + %d timed runs (median), L2 flushed before each\n",
              static_cast<unsigned long long>(g_seed), kWarmup, kReps);
  Stream stream = Stream::create(Device::cuda(0));
  Tensor flush = Tensor::empty({kFlushBytes / 4}, DType::F32, stream);
  std::ofstream out_file;
  if (!out_path.empty()) {
    out_file.open(out_path, std::ios::app);
    MDLM_CHECK(out_file.good(), "megadlm_bench: cannot open --out ", out_path);
  }

  std::vector<Result> results;
  bool all_pass = true;
  for (const OpBench& op : all_benches()) {
    if (!filter.empty() && op.name.find(filter) == std::string::npos) continue;
    Result r;
    r.name = op.name;
    r.shape = op.shape;
    r.matrix = op.flops > 0;
    try {
      const Check c = op.check(stream);
      r.err = c.err;
      r.tol = c.tol;
      r.check = c.pass() ? "PASS" : "FAIL";
    } catch (const std::exception& e) {
      r.note = e.what();
    }
    if (r.check != "PASS") all_pass = false;
    try {
      std::function<void()> fn = op.setup(stream);
      r.ms = median_ms(stream, flush, fn);
      if (r.matrix) {
        r.rate = op.flops / (r.ms * 1e-3) / 1e12;
        r.pct = 100.0 * r.rate / kCeilingBf16Tflops;
      } else {
        r.rate = op.bytes / (r.ms * 1e-3) / 1e9;
        r.pct = 100.0 * r.rate / kCeilingCopyGBps;
      }
    } catch (const std::exception& e) {
      if (!r.note.empty()) r.note += "; ";
      r.note += std::string("timing: ") + e.what();
    }
    stream.synchronize();
    std::printf("%-24s %-5s err %.2e (tol %.0e)  %9.4f ms  %8.1f %s  %5.1f%%  %s\n", r.name.c_str(),
                r.check.c_str(), r.err, r.tol, r.ms, r.rate, r.matrix ? "TFLOP/s" : "GB/s   ", r.pct,
                r.note.c_str());
    std::fflush(stdout);
    if (out_file.is_open()) {
      nlohmann::json j = {{"op", r.name},          {"shape", r.shape},   {"check", r.check},
                          {"check_rel_err", r.err}, {"check_tol", r.tol}, {"median_ms", r.ms},
                          {"reps", kReps},          {"pct_of_ceiling", r.pct}};
      if (r.matrix) {
        j["tflops"] = r.rate;
        j["ceiling_tflops"] = kCeilingBf16Tflops;
      } else {
        j["gbps"] = r.rate;
        j["ceiling_gbps"] = kCeilingCopyGBps;
      }
      if (!r.note.empty()) j["note"] = r.note;
      out_file << j.dump() << "\n";
    }
    results.push_back(r);
  }

  std::printf("\n%-24s %-36s %-5s %9s %10s %12s %7s\n", "op", "timed case", "check", "rel_err",
              "median ms", "rate", "%ceil");
  for (const Result& r : results) {
    std::printf("%-24s %-36s %-5s %9.2e %10.4f %8.1f %-7s %5.1f%%\n", r.name.c_str(), r.shape.c_str(),
                r.check.c_str(), r.err, r.ms, r.rate, r.matrix ? "TFLOP/s" : "GB/s", r.pct);
  }
  std::printf("ceilings: %.0f TFLOP/s bf16 GEMM, %.0f GB/s copy (measured on the H200)\n",
              kCeilingBf16Tflops, kCeilingCopyGBps);
  return all_pass ? 0 : 1;
}

// ---- comm mode ------------------------------------------------------------------------------

constexpr int kCommWarmup = 5;
constexpr int kCommReps = 25;
constexpr int64_t kCommDefaultMiB = 1024;

struct CommBench {
  std::string name;    ///< "all_reduce_bf16"
  const char* op;      ///< "all_reduce"
  DType dtype;
  double bus_factor;   ///< busbw / algbw for n ranks
};

/// Median over kCommReps calls of the slowest rank's time for one call, in ms.
double comm_median_ms(comm::Communicator& world, const Stream& stream, const std::function<void()>& fn) {
#if MEGADLM_WITH_CUDA
  auto cs = static_cast<cudaStream_t>(stream.native());
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < kCommWarmup; ++i) fn();
  world.synchronize(stream);
  std::vector<float> ms(kCommReps);
  for (int i = 0; i < kCommReps; ++i) {
    world.barrier(stream);  // every rank starts the timed call together
    check_cuda(cudaEventRecord(start, cs), "cudaEventRecord");
    fn();
    check_cuda(cudaEventRecord(stop, cs), "cudaEventRecord");
    world.synchronize(stream);  // the collective's own completion (and its timeout)
    // `stop` was recorded after the collective's completion event: the host can see that one
    // complete before `stop`, so wait for `stop` itself before reading the time.
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], start, stop), "cudaEventElapsedTime");
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  Tensor t = Tensor::from_floats(ms, {kCommReps}).to(stream.device(), stream);
  world.all_reduce(t, comm::ReduceOp::Max, stream);
  std::vector<float> slowest = t.to_floats(stream);
  std::sort(slowest.begin(), slowest.end());
  return slowest[slowest.size() / 2];
#else
  (void)world;
  (void)stream;
  (void)fn;
  MDLM_FAIL("megadlm_bench: built without CUDA");
#endif
}

/// Rank-tagged exact check of one collective on a small buffer (1 Mi elements).
bool comm_check(comm::Communicator& world, const Stream& s, const CommBench& b) {
  const int n = world.size(), r = world.rank();
  const int64_t m = int64_t{1} << 20;
  const float tag = static_cast<float>(r + 1), sum = static_cast<float>(n * (n + 1) / 2);
  std::vector<float> got, want;
  if (std::strcmp(b.op, "all_reduce") == 0) {
    Tensor t = Tensor::empty({m}, b.dtype, s);
    ops::fill(t, tag, s);
    world.all_reduce(t, comm::ReduceOp::Sum, s);
    got = t.to_floats(s);
    want.assign(static_cast<size_t>(m), sum);
  } else if (std::strcmp(b.op, "reduce_scatter") == 0) {
    Tensor in = Tensor::empty({m * n}, b.dtype, s), out = Tensor::empty({m}, b.dtype, s);
    ops::fill(in, tag, s);
    world.reduce_scatter(in, out, comm::ReduceOp::Sum, s);
    got = out.to_floats(s);
    want.assign(static_cast<size_t>(m), sum);
  } else {
    Tensor in = Tensor::empty({m}, b.dtype, s), out = Tensor::empty({m * n}, b.dtype, s);
    ops::fill(in, tag, s);
    world.all_gather(in, out, s);
    got = out.to_floats(s);
    for (int p = 0; p < n; ++p) want.insert(want.end(), static_cast<size_t>(m), static_cast<float>(p + 1));
  }
  world.synchronize(s);
  return got == want;
}

int comm_benches(comm::DistributedRuntime& runtime, const std::string& filter, const std::string& out_path,
                 long long mib);

int run_comm(int argc, char** argv) {
  std::string filter, out_path;
  long long mib = kCommDefaultMiB;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--op") == 0 && i + 1 < argc) filter = argv[++i];
    else if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
    else if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = std::atoll(argv[++i]);
    else return usage(argv[0]);
  }
  if (mib < 1) {
    std::fprintf(stderr, "megadlm_bench comm: --mib must be a positive number of MiB\n");
    return 2;
  }
  const comm::LaunchEnvironment env = comm::detect_launch_environment();
  if (env.world_size < 2 || !comm::nccl_compiled() || cuda_device_count() == 0) {
    std::fprintf(stderr, "megadlm_bench comm: needs NCCL, a GPU per rank and 2 or more ranks "
                         "(mpirun -np 2 %s comm); world size %d, NCCL %s, %d GPU(s) visible\n",
                 argv[0], env.world_size, comm::nccl_compiled() ? "built" : "not built",
                 cuda_device_count());
    return 2;
  }
  comm::DistributedRuntime runtime(env, comm::Transport::Nccl, std::chrono::minutes(10));
  try {
    return comm_benches(runtime, filter, out_path, mib);
  } catch (const std::exception& e) {
    // One rank's failure ends the job: its peers would wait in their next collective, and a
    // clean NCCL shutdown of this rank would wait for them (up to the 10-minute timeout).
    std::fprintf(stderr, "megadlm_bench comm: rank %d: %s\n", env.rank, e.what());
    runtime.abort_job(2);
  }
}

int comm_benches(comm::DistributedRuntime& runtime, const std::string& filter, const std::string& out_path,
                 long long mib) {
  const int64_t buffer_bytes = mib << 20;
  comm::Communicator& world = runtime.world();
  const int n = world.size();
  const bool lead = world.rank() == 0;
  const Stream stream = Stream::create(runtime.device());
  std::ofstream out_file;
  if (lead && !out_path.empty()) {
    out_file.open(out_path, std::ios::app);
    MDLM_CHECK(out_file.good(), "megadlm_bench: cannot open --out ", out_path);
  }
  if (lead)
    std::printf("megadlm_bench comm: %d ranks, NCCL %s, %d warm-up + %d timed calls (median of "
                "the slowest rank), %lld MiB buffers\n", n, comm::nccl_version().c_str(),
                kCommWarmup, kCommReps, mib);
  const double ring = static_cast<double>(n - 1) / n;
  const std::vector<CommBench> benches = {
      {"all_reduce_bf16", "all_reduce", DType::BF16, 2 * ring},
      {"all_reduce_f32", "all_reduce", DType::F32, 2 * ring},
      {"reduce_scatter_bf16", "reduce_scatter", DType::BF16, ring},
      {"reduce_scatter_f32", "reduce_scatter", DType::F32, ring},
      {"all_gather_bf16", "all_gather", DType::BF16, ring},
      {"all_gather_f32", "all_gather", DType::F32, ring},
  };
  bool all_pass = true;
  for (const CommBench& b : benches) {
    if (!filter.empty() && b.name.find(filter) == std::string::npos) continue;
    const bool pass = comm_check(world, stream, b);
    all_pass = all_pass && pass;
    // S elements in the full buffer; per-rank pieces are S / n.
    const int64_t total = buffer_bytes / static_cast<int64_t>(dtype_size(b.dtype));
    const int64_t piece = total / n;
    Tensor full = Tensor::empty({piece * n}, b.dtype, stream);
    Tensor part = Tensor::empty({piece}, b.dtype, stream);
    ops::fill(full, 1.0f, stream);
    ops::fill(part, 1.0f, stream);
    std::function<void()> call;
    if (std::strcmp(b.op, "all_reduce") == 0)
      call = [&] { world.all_reduce(full, comm::ReduceOp::Sum, stream); };
    else if (std::strcmp(b.op, "reduce_scatter") == 0)
      call = [&] { world.reduce_scatter(full, part, comm::ReduceOp::Sum, stream); };
    else
      call = [&] { world.all_gather(part, full, stream); };
    const double ms = comm_median_ms(world, stream, call);
    const double bytes = static_cast<double>(full.nbytes());
    const double algbw = bytes / (ms * 1e-3) / 1e9, busbw = algbw * b.bus_factor;
    if (lead) {
      std::printf("%-20s %-5s %8.0f MiB  %9.3f ms  algbw %7.1f GB/s  busbw %7.1f GB/s\n",
                  b.name.c_str(), pass ? "PASS" : "FAIL", bytes / (1 << 20), ms, algbw, busbw);
      std::fflush(stdout);
      if (out_file.is_open()) {
        const nlohmann::json j = {{"collective", b.op},     {"dtype", dtype_name(b.dtype)},
                                  {"ranks", n},             {"bytes", full.nbytes()},
                                  {"check", pass ? "PASS" : "FAIL"},
                                  {"median_ms", ms},        {"reps", kCommReps},
                                  {"algbw_gbps", algbw},    {"busbw_gbps", busbw},
                                  {"nccl", comm::nccl_version()}};
        out_file << j.dump() << "\n";
      }
    }
  }
  return all_pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megadlm_bench: %s\n", e.what());
    return 2;
  }
}
