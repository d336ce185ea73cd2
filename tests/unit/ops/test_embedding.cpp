// Embedding for a vocabulary shard: row lookup with zero rows outside the shard, f64
// finite-difference gradient of the weight (repeated ids add up), and the accumulation contract.
#include <gtest/gtest.h>
#include "megadlm/ops/embedding.h"
#include "support/op_testing.h"
#include "support/tolerances.h"

using namespace megadlm;

TEST(Embedding, ForwardCopiesRowsOfTheShardAndZerosOtherIds) {
  Stream s = Stream::cpu();
  // Shard of rows [4, 7) of the vocabulary, H = 2.
  Tensor w = Tensor::from_floats({40, 41, 50, 51, 60, 61}, {3, 2});
  Tensor ids = Tensor::from_ints({4, 6, 2, 5, 7, -1}, {6});
  Tensor out = Tensor::empty({6, 2}, DType::F32, s);
  ops::embedding_forward(w, ids, out, 4, s);
  EXPECT_EQ(out.to_floats(s), (std::vector<float>{40, 41, 60, 61, 0, 0, 50, 51, 0, 0, 0, 0}));
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Stream s = Stream::cpu();
  const int64_t vocab = 5, hidden = 3, start = 10;
  Tensor w = test::random_tensor({vocab, hidden}, 1, DType::F64);
  Tensor ids = Tensor::from_ints({12, 10, 12, 99, 14, 12, 3}, {7});  // repeats and foreign ids
  Tensor dout = test::random_tensor({7, hidden}, 2, DType::F64);
  Tensor out = Tensor::empty({7, hidden}, DType::F64, s);
  auto loss = [&] {
    ops::embedding_forward(w, ids, out, start, s);
    return test::inner(dout, out);
  };
  Tensor dw = Tensor::zeros({vocab, hidden}, DType::F64, s);
  ops::embedding_backward(ids, dout, dw, start, s);
  EXPECT_LT(test::rel_l2(test::to_doubles(dw), test::finite_difference(w, loss)),
            test::kFiniteDiffRelTolF64);
}

TEST(Embedding, BackwardAccumulatesAndIgnoresIdsOfOtherShards) {
  Stream s = Stream::cpu();
  Tensor ids = Tensor::from_ints({1, 3, 1, 0}, {4});  // shard [1, 3): ids 3 and 0 are foreign
  Tensor dout = Tensor::from_floats({1, 2, 10, 20, 100, 200, 1000, 2000}, {4, 2});
  // dweight is rows 1..2 of a larger buffer: the sentinel rows 0 and 3 are exactly where the
  // foreign ids 0 and 3 would land if the shard bounds were not respected.
  Tensor buffer = Tensor::from_floats({-7, -7, 0.5f, 0.5f, -1, -1, -7, -7}, {4, 2});
  Tensor dw = buffer.narrow(1, 2);
  ops::embedding_backward(ids, dout, dw, 1, s);
  EXPECT_EQ(buffer.to_floats(s), (std::vector<float>{-7, -7, 101.5f, 202.5f, -1, -1, -7, -7}));
  ops::embedding_backward(ids, dout, dw, 1, s);
  EXPECT_EQ(buffer.to_floats(s), (std::vector<float>{-7, -7, 202.5f, 404.5f, -1, -1, -7, -7}));
}

TEST(Embedding, F64GradientsCanAccumulateIntoAnF32MainGrad) {
  Stream s = Stream::cpu();
  Tensor ids = Tensor::from_ints({0, 1, 0}, {3});
  Tensor dout = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {3, 2}, DType::F64);
  Tensor dw = Tensor::zeros({2, 2}, DType::F32, s);
  ops::embedding_backward(ids, dout, dw, 0, s);
  EXPECT_EQ(dw.to_floats(s), (std::vector<float>{6, 8, 3, 4}));
}
