// Internal to megadlm_bench: the op-benchmark table's types and the helpers every group of
// benchmarks uses (defined in apps/megadlm_bench.cpp, the driver). A group lives in its own file
// under apps/megadlm_bench/ and returns its rows: attention.cpp (both attention backends),
// fused.cpp (the fused ops of docs/kernels/fused_ops.md), context_parallel.cpp (the LSE merge of
// CP attention),
// moe.cpp (the MoE ops).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

namespace megadlm::bench {

// Ceilings measured on the benchmark H200 (docs/benchmarks.md): cuBLASLt bf16 GEMM and a large
// device-to-device copy counting bytes read plus bytes written.
inline constexpr double kCeilingBf16Tflops = 811.0;
inline constexpr double kCeilingCopyGBps = 4300.0;

// The 1.7B model.
inline constexpr int64_t kTokens = 8192, kHidden = 2048, kFfn = 6144, kVocab = 50304;
inline constexpr int64_t kHeads = 16, kHeadDim = 128;
inline constexpr int64_t kParamsPerRank = 1'700'000'000 / 28;  // AdamW over one 28th of the parameters

inline constexpr double kTolBf16 = 1e-2;  // bf16 outputs vs the f32 CPU reference (tests/support/tolerances.h)
inline constexpr double kTolF32 = 1e-4;   // fp32 outputs (statistics, losses, weight gradients)

/// Seed of the host-drawn random values (set once per run by the driver).
extern uint64_t g_seed;

std::vector<float> bf16_values(int64_t n, float lo = -1.0f, float hi = 1.0f);
/// A device tensor of random values in [lo, hi) (a few Mi host-drawn values, tiled).
Tensor random_device(const Shape& shape, DType dtype, const Stream& s, float lo = -1.0f, float hi = 1.0f);
Tensor device_ints(const std::vector<int32_t>& v, const Stream& s);
std::vector<int32_t> random_ints(int64_t n, int32_t bound);

/// Same values on both sides: a host f32 tensor for the CPU op, a device tensor in `dtype`.
struct Pair {
  Tensor host, dev;
};
Pair make_pair(const Shape& shape, DType dtype, const Stream& s, float lo = -1.0f, float hi = 1.0f);

/// Relative L2 error of a device result against a host f32 reference (inf on any NaN).
double rel_err(const Tensor& dev, const Tensor& host, const Stream& s);

struct Check {
  double err = std::numeric_limits<double>::infinity();  ///< worst of the outputs' err / tol ratios, reported as err of that output
  double tol = 0;
  void add(double e, double t) {
    if (tol == 0 || e / t > err / tol) {
      err = e;
      tol = t;
    }
  }
  bool pass() const { return tol > 0 && err <= tol; }
};

struct OpBench {
  std::string name;
  std::string shape;  ///< the timed case, for the table
  double flops = 0;   ///< per call, matrix ops
  double bytes = 0;   ///< per call, memory-bound ops
  std::function<Check(const Stream&)> check;
  /// Allocates the big case and returns the call to time.
  std::function<std::function<void()>(const Stream&)> setup;
};

std::vector<OpBench> attention_benches();
std::vector<OpBench> fused_benches();
std::vector<OpBench> context_parallel_benches();
std::vector<OpBench> moe_benches();
std::vector<OpBench> fp8_benches();

}  // namespace megadlm::bench
