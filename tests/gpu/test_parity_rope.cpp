// RoPE parity: CUDA in-place rotation (bf16 and f32) against the CPU reference on the same
// bf16-rounded inputs and positions up to 8191, full and partial rotary_dim, vectorized and
// single-element layouts, forward and backward; elements past rotary_dim must stay bit-identical.
#include <gtest/gtest.h>
#include "megadlm/ops/rope.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// Tolerance: bf16 output rounding (kBf16ParityRelL2); f32: fp32 angles are formed identically
/// (1 / powf, fp32 product) but CUDA's powf/sincosf may differ from the host's by an ulp or two,
/// which at |theta| ~ 8000 moves the angle by ~1e-3 rad on the fastest frequencies: 1e-2 covers it.
void check(int64_t tokens, int64_t heads, int64_t head_dim, int64_t rotary_dim, DType dt) {
  Stream gpu = gpu_stream();
  const ops::RopeArgs args{.heads = heads, .head_dim = head_dim, .rotary_dim = rotary_dim,
                           .base = 10000.0f};
  std::vector<int32_t> pos(static_cast<size_t>(tokens));
  const std::vector<float> u = test::random_floats(tokens, fresh_seed(), 0.0f, 8192.0f);
  for (int64_t t = 0; t < tokens; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(u[static_cast<size_t>(t)]);
  Tensor pos_host = Tensor::from_ints(pos, {tokens});
  Tensor pos_dev = pos_host.to(gpu.device(), gpu);
  const Shape shape{tokens, heads, head_dim};
  for (bool backward : {false, true}) {
    const std::string tag = detail::concat(backward ? "rope_backward" : "rope_forward", " [", tokens,
                                           ", ", heads, ", ", head_dim, "] rotary ", rotary_dim, " ",
                                           dtype_name(dt));
    Input x = make_input(shape, dt, gpu);
    Tensor dev = x.device, host = x.host;
    if (backward) {
      ops::rope_backward(dev, pos_dev, args, gpu);
      ops::rope_backward(host, pos_host, args, Stream::cpu());
    } else {
      ops::rope_forward(dev, pos_dev, args, gpu);
      ops::rope_forward(host, pos_host, args, Stream::cpu());
    }
    const std::vector<double> got = download(dev, gpu);
    expect_close(tag, got, test::to_doubles(host), test::kBf16ParityRelL2);
    size_t changed = 0;
    for (int64_t v = 0; v < tokens * heads; ++v)
      for (int64_t i = rotary_dim; i < head_dim; ++i) {
        const size_t idx = static_cast<size_t>(v * head_dim + i);
        changed += got[idx] != static_cast<double>(x.values[idx]);
      }
    EXPECT_EQ(changed, 0u) << tag << ": elements past rotary_dim were modified";
  }
}

}  // namespace

TEST(RopeParity, MatchesCpuForwardAndBackward) {
  MDLM_REQUIRE_GPU();
  check(257, 16, 128, 128, DType::BF16);  // the 1.7B model's q, vectorized
  check(301, 5, 64, 32, DType::BF16);     // partial rotary, head count not a multiple of 4
  check(129, 3, 70, 54, DType::BF16);     // odd half (27): single-element path
  check(65, 8, 128, 128, DType::F32);
  check(33, 7, 36, 12, DType::F32);
}
