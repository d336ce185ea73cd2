// Elementwise and column-layout ops: exact results (no rounding is involved in any of them except
// the documented dtype conversion of copy and fill).
#include <gtest/gtest.h>
#include "megadlm/ops/elementwise.h"
#include "support/op_testing.h"

using namespace megadlm;

TEST(Add, SumsElementwiseAndMayWriteIntoAnInput) {
  Stream s = Stream::cpu();
  Tensor a = Tensor::from_floats({1, 2, 3}, {3}, DType::F64);
  Tensor b = Tensor::from_floats({10, 20, 30}, {3}, DType::F64);
  Tensor out = Tensor::empty({3}, DType::F64, s);
  ops::add(a, b, out, s);
  EXPECT_EQ(test::to_doubles(out), (std::vector<double>{11, 22, 33}));
  ops::add(a, b, a, s);  // out aliases a
  EXPECT_EQ(test::to_doubles(a), (std::vector<double>{11, 22, 33}));
}

TEST(ScaleInplace, MultipliesEveryElement) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_floats({1, -2, 0.5f}, {3});
  ops::scale_inplace(x, -4.0f, s);
  EXPECT_EQ(x.to_floats(s), (std::vector<float>{-4, 8, -2}));
}

TEST(Fill, WritesTheValueInEachDtype) {
  Stream s = Stream::cpu();
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I32}) {
    Tensor x = Tensor::empty({5}, dt, s);
    ops::fill(x, 3.0f, s);
    EXPECT_EQ(x.to_floats(s), std::vector<float>(5, 3.0f)) << dtype_name(dt);
  }
  Tensor b = Tensor::empty({2}, DType::BF16, s);
  ops::fill(b, 1.0f + 1.0f / 512, s);  // rounds to the nearest bf16 value
  EXPECT_EQ(b.to_floats(s)[0], round_to_bf16(1.0f + 1.0f / 512));
}

TEST(Copy, ConvertsBetweenDtypes) {
  Stream s = Stream::cpu();
  Tensor src = Tensor::from_floats({1.0f, -2.5f, 1.0f / 3}, {3});
  Tensor b = Tensor::empty({3}, DType::BF16, s);
  Tensor d = Tensor::empty({3}, DType::F64, s);
  ops::copy(src, b, s);
  ops::copy(src, d, s);
  EXPECT_EQ(b.to_floats(s), (std::vector<float>{1.0f, -2.5f, round_to_bf16(1.0f / 3)}));
  EXPECT_EQ(test::to_doubles(d), (std::vector<double>{1.0, -2.5, static_cast<double>(1.0f / 3)}));
}

TEST(SplitColumns, CutsEachRowIntoTheParts) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_floats({0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15}, {2, 6});
  Tensor a = Tensor::empty({2, 1}, DType::F32, s), b = Tensor::empty({2, 3}, DType::F32, s),
         c = Tensor::empty({2, 2}, DType::F32, s);
  ops::split_columns(x, {&a, &b, &c}, s);
  EXPECT_EQ(a.to_floats(s), (std::vector<float>{0, 10}));
  EXPECT_EQ(b.to_floats(s), (std::vector<float>{1, 2, 3, 11, 12, 13}));
  EXPECT_EQ(c.to_floats(s), (std::vector<float>{4, 5, 14, 15}));
}

TEST(ConcatColumns, IsTheInverseOfSplitColumns) {
  Stream s = Stream::cpu();
  Tensor x = test::random_tensor({3, 2, 7}, 1, DType::F64);  // viewed as [6, 7]
  Tensor a = Tensor::empty({6, 4}, DType::F64, s), b = Tensor::empty({6, 3}, DType::F64, s);
  ops::split_columns(x, {&a, &b}, s);
  Tensor back = Tensor::empty({3, 2, 7}, DType::F64, s);
  ops::concat_columns({&a, &b}, back, s);
  EXPECT_EQ(test::to_doubles(back), test::to_doubles(x));
  const std::vector<double> xv = test::to_doubles(x), bv = test::to_doubles(b);
  EXPECT_EQ(bv[0], xv[4]);   // row 0, column 4
  EXPECT_EQ(bv[5], xv[13]);  // row 1, column 6
}

TEST(ConcatColumns, RejectsPartsWhoseWidthsDoNotAddUp) {
  Stream s = Stream::cpu();
  Tensor a = Tensor::zeros({2, 2}, DType::F32, s), out = Tensor::zeros({2, 3}, DType::F32, s);
  EXPECT_THROW(ops::concat_columns({&a}, out, s), Error);
}

TEST(GatherRows, PicksTheIndexedRowsInOrder) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_floats({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor idx = Tensor::from_ints({2, 0, 2, 1}, {4});
  Tensor out = Tensor::empty({4, 2}, DType::F32, s);
  ops::gather_rows(x, idx, out, s);
  EXPECT_EQ(out.to_floats(s), (std::vector<float>{20, 21, 0, 1, 20, 21, 10, 11}));
}

TEST(GatherRows, MovesIntegerRowsAndRejectsIndicesOutsideTheSource) {
  Stream s = Stream::cpu();
  Tensor x = Tensor::from_ints({5, 6, 7}, {3, 1});
  Tensor out = Tensor::empty({2, 1}, DType::I32, s);
  ops::gather_rows(x, Tensor::from_ints({1, 2}, {2}), out, s);
  EXPECT_EQ(out.data<int32_t>()[0], 6);
  EXPECT_EQ(out.data<int32_t>()[1], 7);
  EXPECT_THROW(ops::gather_rows(x, Tensor::from_ints({3, 0}, {2}), out, s), Error);
  Tensor wide = Tensor::empty({2, 2}, DType::I32, s);
  EXPECT_THROW(ops::gather_rows(x, Tensor::from_ints({0, 1}, {2}), wide, s), Error);
}
