// Helpers for the CUDA-vs-CPU parity tests (test ring 3): bf16-rounded random inputs held once on
// the host (f32, for the CPU reference) and once on the device (in the CUDA dtype), NaN-poisoned
// outputs so that an unwritten element fails the comparison, and a per-case error report printed
// with std::printf (the project's notes collect these lines).
//
// Inputs come from a fixed seed: every test draws its tensors from seed_base() mixed with its
// own name, in order, and prints "[parity] <Suite.Test>: seed base N" before its first draw, so a
// failure replays exactly (the same binary gives the same inputs). MEGADLM_PARITY_SEED=N draws
// from another base (to try other inputs, or to replay a run made with one).
#pragma once
#include <gtest/gtest.h>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

namespace megadlm::test::parity {

/// The seed base of every run that does not set MEGADLM_PARITY_SEED.
inline constexpr uint64_t kSeedBase = 20261204;

inline uint64_t seed_base() {
  static const uint64_t base = [] {
    const char* env = std::getenv("MEGADLM_PARITY_SEED");
    if (env == nullptr || *env == '\0') return kSeedBase;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (errno != 0 || *end != '\0' || *env == '-')
      throw std::invalid_argument(std::string("MEGADLM_PARITY_SEED=") + env +
                                  ": expected a decimal integer in [0, 2^64) (unset: " +
                                  std::to_string(kSeedBase) + ")");
    return static_cast<uint64_t>(v);
  }();
  return base;
}

/// FNV-1a of a test's full name: each test has its own inputs, independent of the tests that ran
/// before it in the same process.
inline uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

/// The next seed of the running test: its n-th draw gets base ^ hash(name) + n * golden ratio.
/// Prints the base once per test.
inline uint64_t fresh_seed() {
  static std::mutex mu;
  static std::string current;
  static uint64_t drawn = 0;
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info != nullptr ? std::string(info->test_suite_name()) + "." + info->name() : "(no test)";
  std::lock_guard<std::mutex> lock(mu);
  if (name != current) {
    current = name;
    drawn = 0;
    std::printf("[parity] %s: seed base %" PRIu64 " (replay: MEGADLM_PARITY_SEED=%" PRIu64
                " --gtest_filter=%s)\n", name.c_str(), seed_base(), seed_base(), name.c_str());
  }
  return (seed_base() ^ name_hash(name)) + 0x9E3779B97F4A7C15ull * ++drawn;
}

inline Stream gpu_stream() { return Stream::create(Device::cuda(0)); }

/// Random values in [lo, hi), rounded to bf16 so that both backends read identical numbers.
inline std::vector<float> bf16_values(int64_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = random_floats(n, fresh_seed(), lo, hi);
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

inline Tensor to_device(const std::vector<float>& v, const Shape& shape, DType dtype,
                        const Stream& gpu) {
  return Tensor::from_floats(v, shape, dtype).to(gpu.device(), gpu);
}

inline Tensor ints_to_device(const std::vector<int32_t>& v, const Shape& shape, const Stream& gpu) {
  return Tensor::from_ints(v, shape).to(gpu.device(), gpu);
}

/// One input: the same bf16-representable values as a host f32 tensor and a device tensor.
struct Input {
  std::vector<float> values;
  Tensor host;    ///< f32, for the CPU reference
  Tensor device;  ///< `dtype`, for the CUDA op
};

inline Input make_input(const Shape& shape, DType dtype, const Stream& gpu, float lo = -1.0f,
                        float hi = 1.0f) {
  Input in;
  in.values = bf16_values(shape_numel(shape), lo, hi);
  in.host = Tensor::from_floats(in.values, shape, DType::F32);
  in.device = to_device(in.values, shape, dtype, gpu);
  return in;
}

/// A device tensor whose every element is NaN (a quiet NaN bit pattern in bf16/f16/f32).
inline Tensor poisoned(const Shape& shape, DType dtype, const Stream& gpu) {
  return to_device(std::vector<float>(static_cast<size_t>(shape_numel(shape)), NAN), shape, dtype, gpu);
}

/// A host f32 tensor of NaN (CPU outputs are poisoned too, so a CPU op that skips an element
/// cannot make the comparison pass by accident).
inline Tensor poisoned_host(const Shape& shape) {
  return Tensor::from_floats(std::vector<float>(static_cast<size_t>(shape_numel(shape)), NAN), shape);
}

inline std::vector<double> download(const Tensor& t, const Stream& gpu) { return to_doubles(t, gpu); }

struct Diff {
  double rel_l2 = 0;
  double max_abs = 0;
  size_t worst = 0;
  size_t non_finite = 0;  ///< elements of `got` that are NaN or inf where `want` is finite
};

/// Relative L2 error of got against want, the largest absolute error and where it is; printed.
inline Diff compare(const std::string& what, const std::vector<double>& got,
                    const std::vector<double>& want) {
  Diff d;
  EXPECT_EQ(got.size(), want.size()) << what;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) ++d.non_finite;
    const double e = std::fabs(got[i] - want[i]);
    if (!(e <= d.max_abs)) {  // also catches NaN
      d.max_abs = e;
      d.worst = i;
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  d.rel_l2 = d.non_finite ? INFINITY : std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
  const double g = d.worst < got.size() ? got[d.worst] : NAN;
  const double w = d.worst < want.size() ? want[d.worst] : NAN;
  std::printf("[parity] %-58s rel_l2 %.3e  max_abs %.3e at %zu (cuda %.6g, cpu %.6g)%s\n",
              what.c_str(), d.rel_l2, d.max_abs, d.worst, g, w,
              d.non_finite ? "  NON-FINITE OUTPUT" : "");
  return d;
}

/// compare() plus the test assertion: rel_l2 <= tol and no unwritten (NaN) element.
inline void expect_close(const std::string& what, const std::vector<double>& got,
                         const std::vector<double>& want, double tol) {
  const Diff d = compare(what, got, want);
  EXPECT_EQ(d.non_finite, 0u) << what << ": " << d.non_finite << " non-finite elements (unwritten?)";
  EXPECT_LE(d.rel_l2, tol) << what;
}

/// Bitwise equality of two downloads (determinism checks).
inline void expect_identical(const std::string& what, const std::vector<double>& a,
                             const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += !(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])));
  std::printf("[parity] %-58s %zu of %zu elements differ between runs\n", what.c_str(), differ, a.size());
  EXPECT_EQ(differ, 0u) << what;
}

inline std::vector<double> as_doubles(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace megadlm::test::parity
