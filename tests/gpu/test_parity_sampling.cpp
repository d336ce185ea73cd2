// Sampler proposals parity: CUDA sample_proposals (bf16 and f32 logits) against the CPU reference
// on the same bf16-representable logits, for the 1.7B model's vocabulary and small ones, greedy
// and with float64 Gumbel noise, with and without guidance, softmax and random confidence.
// Tokens must be identical (both pick the first maximum; guidance is combined in f32 without FMA
// on both; the Gumbel uniforms are the same Philox numbers); confidences agree to float64
// rounding of differently ordered sums (1e-12 relative).
#include <gtest/gtest.h>
#include <cmath>
#include <string>
#include "megadlm/ops/sampling.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

void check(int64_t rows, int64_t vocab, DType dt, double temperature, float cfg, ops::ProposalConfidence conf) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("sample_proposals [", rows, ", ", vocab, "] ", dtype_name(dt), " tau ",
                                         temperature, " cfg ", cfg, conf == ops::ProposalConfidence::Random ? " random" : "");
  Input c = make_input({rows, vocab}, dt, gpu, -8.0f, 8.0f);
  Input u = make_input({rows, vocab}, dt, gpu, -8.0f, 8.0f);
  std::vector<int32_t> keys;
  for (int64_t r = 0; r < rows; ++r) {
    keys.push_back(static_cast<int32_t>(1000 + r / 3));
    keys.push_back(static_cast<int32_t>(r % 7));
  }
  ops::ProposalArgs a;
  a.temperature = temperature;
  a.cfg_scale = cfg;
  a.seed = 77;
  a.step = 5;
  a.confidence = conf;
  a.suppress_token = static_cast<int32_t>(vocab / 2);
  Tensor tok = Tensor::empty({rows}, DType::I32, gpu), p = Tensor::empty({rows}, DType::F64, gpu);
  ops::sample_proposals(c.device, cfg > 0 ? u.device : Tensor(), ints_to_device(keys, {rows, 2}, gpu), a, tok, p, gpu);
  Tensor tok_ref = Tensor::empty({rows}, DType::I32, Stream::cpu()), p_ref = Tensor::empty({rows}, DType::F64, Stream::cpu());
  ops::sample_proposals(c.host, cfg > 0 ? u.host : Tensor(), Tensor::from_ints(keys, {rows, 2}), a, tok_ref, p_ref,
                        Stream::cpu());
  EXPECT_EQ(tok.to_ints(gpu), tok_ref.to_ints(Stream::cpu())) << tag;
  expect_close(tag + " confidence", download(p, gpu), test::to_doubles(p_ref), 1e-12);
}

}  // namespace

TEST(SamplingParity, ProposalsMatchTheCpuReference) {
  MDLM_REQUIRE_GPU();
  using C = ops::ProposalConfidence;
  check(64, 50304, DType::BF16, 0.0, 0.0f, C::Softmax);
  check(64, 50304, DType::BF16, 0.7, 0.0f, C::Softmax);
  check(33, 50289, DType::BF16, 1.0, 1.5f, C::Softmax);
  check(20, 50304, DType::BF16, 0.0, 0.5f, C::Random);
  check(7, 3, DType::BF16, 0.5, 0.0f, C::Softmax);  // fewer tokens than threads
  check(16, 1000, DType::F32, 0.3, 2.0f, C::Softmax);
}
