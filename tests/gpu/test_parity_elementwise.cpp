// Elementwise parity: add (with out aliasing an input), scale_inplace, fill, copy with dtype
// conversion, and split/concat_columns on CUDA against the CPU reference, for bf16 and f32,
// vector-aligned and odd sizes. Layout ops move bits, so they are checked for exact equality.
#include <gtest/gtest.h>
#include "megadlm/ops/elementwise.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// bf16 arithmetic outputs: one bf16 rounding of the fp32 result (kBf16ParityRelL2); f32 ones are
/// a single fp32 operation, the same on both backends (0 would do; kF32ElementwiseRelL2 leaves
/// room for FMA contraction).
double tol(DType dt) { return dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32ElementwiseRelL2; }

}  // namespace

TEST(ElementwiseParity, AddMatchesCpuIncludingInPlace) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int64_t n : {int64_t{1} << 20, int64_t{1000003}, int64_t{5}}) {
      const std::string tag = detail::concat("add n=", n, " ", dtype_name(dt));
      Input a = make_input({n}, dt, gpu), b = make_input({n}, dt, gpu);
      Tensor out = poisoned({n}, dt, gpu), out_ref = poisoned_host({n});
      ops::add(a.device, b.device, out, gpu);
      ops::add(a.host, b.host, out_ref, Stream::cpu());
      expect_close(tag, download(out, gpu), test::to_doubles(out_ref), tol(dt));
      ops::add(a.device, b.device, a.device, gpu);  // out aliases a
      expect_close(tag + " in place", download(a.device, gpu), test::to_doubles(out_ref), tol(dt));
    }
  }
}

TEST(ElementwiseParity, ScaleAndFillMatchCpu) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  for (DType dt : {DType::BF16, DType::F32}) {
    for (int64_t n : {int64_t{1} << 20, int64_t{12345}}) {
      const std::string tag = detail::concat("n=", n, " ", dtype_name(dt));
      Input x = make_input({n}, dt, gpu);
      ops::scale_inplace(x.device, -0.37f, gpu);
      ops::scale_inplace(x.host, -0.37f, Stream::cpu());
      expect_close("scale_inplace " + tag, download(x.device, gpu), test::to_doubles(x.host), tol(dt));
      for (float value : {1.5f, 0.0f, -0.0f}) {
        Tensor t = poisoned({n}, dt, gpu);
        ops::fill(t, value, gpu);
        const std::vector<double> got = download(t, gpu);
        expect_close(detail::concat("fill ", value, " ", tag), got,
                     std::vector<double>(static_cast<size_t>(n), value), 0.0);
      }
    }
  }
  Tensor ints = Tensor::empty({1001}, DType::I32, gpu);
  ops::fill(ints, 7.0f, gpu);
  expect_close("fill 7 i32 n=1001", download(ints, gpu), std::vector<double>(1001, 7.0), 0.0);
}

TEST(ElementwiseParity, CopyConvertsLikeTheCpu) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  const int64_t n = 100003;
  // f32 values that are not bf16-representable, so the conversion's rounding is exercised.
  const std::vector<float> v = test::random_floats(n, fresh_seed());
  Tensor src = to_device(v, {n}, DType::F32, gpu);
  Tensor dst = poisoned({n}, DType::BF16, gpu);
  ops::copy(src, dst, gpu);
  Tensor ref = Tensor::from_floats(v, {n}, DType::BF16);  // host round-to-nearest-even
  expect_close("copy f32 -> bf16 (exact RNE)", download(dst, gpu), test::to_doubles(ref), 0.0);
}

TEST(ElementwiseParity, SplitAndConcatColumnsMoveExactlyTheRightBits) {
  MDLM_REQUIRE_GPU();
  Stream gpu = gpu_stream();
  struct Case {
    int64_t rows;
    std::vector<int64_t> widths;
    DType dt;
  };
  const Case cases[] = {{4097, {2048, 512, 512}, DType::BF16},  // the qkv split, 16-byte units
                        {333, {3, 8, 13}, DType::BF16},           // 2-byte units
                        {37, {50257, 47}, DType::BF16},           // logits_at's odd vocabulary
                        {70000, {4, 4}, DType::F32},              // more rows than grid.y
                        {55, {1, 7, 2}, DType::F32}};
  for (const Case& c : cases) {
    int64_t total = 0;
    for (int64_t w : c.widths) total += w;
    const std::string tag = detail::concat("[", c.rows, ", ", total, "] ", dtype_name(c.dt), " into ",
                                           c.widths.size(), " parts");
    Input x = make_input({c.rows, total}, c.dt, gpu);
    std::vector<Tensor> dev_parts, host_parts;
    for (int64_t w : c.widths) {
      dev_parts.push_back(poisoned({c.rows, w}, c.dt, gpu));
      host_parts.push_back(poisoned_host({c.rows, w}));
    }
    std::vector<Tensor*> dev_out, host_out;
    for (size_t i = 0; i < dev_parts.size(); ++i) {
      dev_out.push_back(&dev_parts[i]);
      host_out.push_back(&host_parts[i]);
    }
    ops::split_columns(x.device, dev_out, gpu);
    ops::split_columns(x.host, host_out, Stream::cpu());
    for (size_t i = 0; i < dev_parts.size(); ++i)
      expect_close(detail::concat("split_columns ", tag, " part ", i), download(dev_parts[i], gpu),
                   test::to_doubles(host_parts[i]), 0.0);
    std::vector<const Tensor*> parts;
    for (const Tensor& p : dev_parts) parts.push_back(&p);
    Tensor back = poisoned({c.rows, total}, c.dt, gpu);
    ops::concat_columns(parts, back, gpu);
    expect_close("concat_columns " + tag + " (round trip)", download(back, gpu), as_doubles(x.values), 0.0);
  }
}
