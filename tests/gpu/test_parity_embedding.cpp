// Embedding parity: the CUDA gather must equal the CPU one exactly (a copy), and the CUDA backward
// (stable sort by id, chunked run sums; no atomics) must match the CPU scatter-add and be bitwise
// reproducible. Ids include a very frequent one (runs over many chunks, like a diffusion mask
// token), ids of other vocabulary shards (vocab_start != 0), and a non-zero starting dweight.
#include <gtest/gtest.h>
#include "megadlm/ops/embedding.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// Token ids in [0, 2 * vocab): a third of them one frequent id, the rest uniform, so that about
/// half fall outside the shard [vocab_start, vocab_start + vocab) with vocab_start = vocab / 2.
std::vector<int32_t> make_ids(int64_t tokens, int64_t vocab, int32_t frequent) {
  const std::vector<float> u = test::random_floats(2 * tokens, fresh_seed());
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    const bool heavy = u[static_cast<size_t>(2 * t)] < -1.0f / 3.0f;
    const float v = (u[static_cast<size_t>(2 * t + 1)] + 1.0f) * 0.5f;  // [0, 1)
    ids[static_cast<size_t>(t)] = heavy ? frequent : static_cast<int32_t>(v * 2 * static_cast<float>(vocab));
  }
  return ids;
}

void check(int64_t tokens, int64_t vocab, int64_t hidden, DType dt) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("embedding T=", tokens, " V=", vocab, " H=", hidden, " ",
                                         dtype_name(dt));
  const int64_t vocab_start = vocab / 2;
  const std::vector<int32_t> ids = make_ids(tokens, vocab, static_cast<int32_t>(vocab_start + 3));
  Tensor ids_host = Tensor::from_ints(ids, {tokens});
  Tensor ids_dev = ids_host.to(gpu.device(), gpu);
  Input w = make_input({vocab, hidden}, dt, gpu);
  Tensor out = poisoned({tokens, hidden}, dt, gpu), out_ref = poisoned_host({tokens, hidden});
  ops::embedding_forward(w.device, ids_dev, out, vocab_start, gpu);
  ops::embedding_forward(w.host, ids_host, out_ref, vocab_start, Stream::cpu());
  // A gather of bf16 values that the CPU holds exactly in f32: equal element for element.
  expect_close(tag + " forward", download(out, gpu), test::to_doubles(out_ref), 0.0);

  Input dout = make_input({tokens, hidden}, dt, gpu);
  Input dw0 = make_input({vocab, hidden}, DType::F32, gpu);
  Tensor dw = dw0.device, dw_ref = dw0.host;
  ops::embedding_backward(ids_dev, dout.device, dw, vocab_start, gpu);
  ops::embedding_backward(ids_host, dout.host, dw_ref, vocab_start, Stream::cpu());
  // fp32 sums of up to ~tokens/3 rows in sorted-token order vs the CPU's running fp32 sum:
  // summation order only.
  const std::vector<double> first = download(dw, gpu);
  expect_close(tag + " backward (+= into random)", first, test::to_doubles(dw_ref), test::kF32AccumRelL2);

  // dw0's tensors were updated in place; the rerun starts again from the original values.
  Tensor dw_again = to_device(dw0.values, {vocab, hidden}, DType::F32, gpu);
  ops::embedding_backward(ids_dev, dout.device, dw_again, vocab_start, gpu);
  expect_identical(tag + " backward, two runs", first, download(dw_again, gpu));
}

}  // namespace

TEST(EmbeddingParity, MatchesCpuAndIsDeterministic) {
  MDLM_REQUIRE_GPU();
  check(8192, 2048, 2048, DType::BF16);  // the 1.7B model's hidden size
  check(3001, 1000, 100, DType::BF16);   // hidden not a multiple of 8: single-element path
  check(777, 300, 64, DType::F32);
  check(5, 50, 16, DType::BF16);         // fewer tokens than one chunk
}
