// megadlm_bench: op benchmarks on one CUDA device, through the public ops:: API only, and
// collective bandwidth over NCCL through comm::Communicator.
//
//   megadlm_bench ops [--op NAME] [--out FILE]
//   mpirun -np 2 megadlm_bench comm [--op NAME] [--out FILE]
//
// For every op (or the ones whose name contains NAME, or one of NAME,NAME,...): first a small
// case run on CUDA and on the CPU reference with the same bf16-rounded inputs (PASS/FAIL with the
// relative L2 error), then the big case of the 1.7B model (T = 8192 tokens, hidden 2048, SwiGLU
// FFN 6144, vocabulary 50304, 16 heads of 128; attention at B=4, H=16, S=2048, D=128) timed with
// CUDA events: warm-up, then kReps repetitions each preceded (outside the timed region) by a
// write of a 256 MiB buffer so that no input is served from L2, median reported. Matrix ops
// report TFLOP/s against the measured bf16 GEMM ceiling, memory-bound ops GB/s (bytes each input
// is read once + each output written once) against the measured copy bandwidth. A JSON line per
// op goes to --out; a table is printed last. Exit codes: 0 all checks passed, 1 a check failed,
// 2 no device or bad usage, 3 an unexpected failure. Each subcommand's flags are a table
// (bench_flags below; tool_cli.h parses them and prints `megadlm_bench ops --help`).
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
// The rows of attention (both backends) and of the fused ops live in apps/megadlm_bench/*.cpp
// (bench.h declares the helpers they share with this driver).
//
// The one exception to "CUDA headers only under src/": this program times with cudaEvent_t, the
// only way to time single launches of a few microseconds; nothing else here touches the runtime.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "megadlm/comm/bootstrap.h"
#include "megadlm/core/logging.h"
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
#include "megadlm/ops/norm.h"
#include "megadlm/ops/optimizer.h"
#include "megadlm/ops/reduce.h"
#include "megadlm/ops/rope.h"
#if MEGADLM_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "megadlm_bench/bench.h"
#include "tool_cli.h"

// Shared with the other megadlm_bench/*.cpp files (declared in megadlm_bench/bench.h).
namespace megadlm::bench {

using namespace megadlm;

// ---- data (shared) -----------------------------------------------------------------------------------

uint64_t g_seed = 0;

std::vector<float> bf16_values(int64_t n, float lo, float hi) {
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
Tensor random_device(const Shape& shape, DType dtype, const Stream& s, float lo, float hi) {
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


Pair make_pair(const Shape& shape, DType dtype, const Stream& s, float lo, float hi) {
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

}  // namespace megadlm::bench

namespace {

using namespace megadlm;
using namespace megadlm::bench;

/// --op: empty (every op), a substring of the name, or several substrings separated by commas.
bool selected(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t from = 0;
  while (from <= filter.size()) {
    const size_t comma = std::min(filter.find(',', from), filter.size());
    const std::string part = filter.substr(from, comma - from);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    from = comma + 1;
  }
  return false;
}

constexpr int kWarmup = 5;
constexpr int kReps = 25;
constexpr int64_t kFlushBytes = int64_t{256} << 20;  // > 50 MiB of L2, several times over

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

// ---- the op table ---------------------------------------------------------------------------




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

std::vector<OpBench> all_benches() {
  std::vector<OpBench> all;
  for (auto&& group : {gemm_benches(), norm_benches(), rope_benches(), activation_benches(),
                       cross_entropy_benches(), cross_entropy_shard_benches(), optimizer_benches(),
                       embedding_benches(), elementwise_benches(), attention_benches(), fused_benches(),
                       context_parallel_benches(), moe_benches(), fp8_benches()})
    all.insert(all.end(), group.begin(), group.end());
  return all;
}

// ---- driver ---------------------------------------------------------------------------------

struct Result {
  std::string name, shape, check = "ERROR", note;
  double err = NAN, tol = NAN, ms = NAN, rate = NAN, pct = NAN;
  bool matrix = false;
};

const char* kUsage =
    "usage: megadlm_bench ops [--op NAME] [--out FILE]\n"
    "       mpirun -np N megadlm_bench comm [--op NAME] [--mib SIZE] [--out FILE]\n"
    "ops: every op against its CPU reference, then timed (median of device-timed runs, L2 flushed);\n"
    "comm: the collectives' bus bandwidth over NCCL. Exit codes: 0 all checks passed, 1 a check failed,\n"
    "2 bad arguments or a reported error, 3 an unexpected failure.";

std::vector<apps::CliFlag> bench_flags(bool comm) {
  std::vector<apps::CliFlag> f = {
      {"--op", "NAME", "only the ops (or collectives) whose name contains NAME (comma-separated: any of them), "
                       "e.g. gemm, rms_norm_bwd, all_reduce"},
      {"--out", "FILE", "append one JSON line per op or collective to FILE"},
  };
  if (comm)
    f.push_back({.name = "--mib", .value = "SIZE", .help = "message size of the collectives in MiB",
                 .kind = training::FlagKind::Int, .default_value = "1024", .range = "[1, inf)"});
  return f;
}

int run_comm(const apps::Cli& cli, const char* argv0);

int run_ops(const apps::Cli& cli) {
  const std::string filter = cli.get("--op"), out_path = cli.get("--out");
  if (cuda_device_count() == 0) {
    logging::error("megadlm_bench: no CUDA device visible");
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
    if (!selected(op.name, filter)) continue;
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

int run_comm(const apps::Cli& cli, const char* argv0) {
  const std::string filter = cli.get("--op"), out_path = cli.get("--out");
  const long long mib = cli.integer("--mib");
  const comm::LaunchEnvironment env = comm::detect_launch_environment();
  logging::Options log_options;
  log_options.rank = env.rank;
  logging::configure(log_options);
  if (env.world_size < 2 || !comm::nccl_compiled() || cuda_device_count() == 0) {
    logging::error("megadlm_bench comm: needs NCCL, a GPU per rank and 2 or more ranks (mpirun -np 2 ", argv0,
                   " comm); world size ", env.world_size, ", NCCL ", comm::nccl_compiled() ? "built" : "not built",
                   ", ", cuda_device_count(), " GPU(s) visible");
    return 2;
  }
  comm::DistributedRuntime runtime(env, comm::Transport::Nccl, std::chrono::minutes(10));
  try {
    return comm_benches(runtime, filter, out_path, mib);
  } catch (const std::exception& e) {
    // One rank's failure ends the job: its peers would wait in their next collective, and a
    // clean NCCL shutdown of this rank would wait for them (up to the 10-minute timeout).
    logging::error("megadlm_bench comm: ", e.what());  // with the rank prefix
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
    if (!selected(b.name, filter)) continue;
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
  // A subcommand, then its own flags (its table: `megadlm_bench ops --help`).
  const std::string sub = argc >= 2 ? argv[1] : "";
  if (sub != "ops" && sub != "comm") {
    const bool help = sub == "--help" || sub == "-h";
    (help ? std::cout : std::cerr) << kUsage << "\n";
    if (!help) std::cerr << "error: give the subcommand ops or comm" << (sub.empty() ? "" : ", not `" + sub + "`") << "\n";
    return help ? 0 : 2;
  }
  return apps::tool_main(argc - 1, argv + 1, {"megadlm_bench " + sub, kUsage, bench_flags(sub == "comm")},
                         [&](const apps::Cli& cli) { return sub == "comm" ? run_comm(cli, argv[0]) : run_ops(cli); });
}
