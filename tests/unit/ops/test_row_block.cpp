// ops::copy_row_block on the CPU: every batch row's block lands at its offset, the rest of dst is
// untouched, and bad shapes are refused by name.
#include <gtest/gtest.h>
#include "megadlm/core/error.h"
#include "megadlm/ops/row_block.h"

using namespace megadlm;

TEST(RowBlock, WritesEachBatchRowsBlockAtItsOffsetAndNothingElse) {
  const int64_t batch = 3, dst_rows = 5, src_rows = 2, width = 4, row0 = 2;
  std::vector<int32_t> d(static_cast<size_t>(batch * dst_rows * width)), s(static_cast<size_t>(batch * src_rows * width));
  for (size_t i = 0; i < d.size(); ++i) d[i] = -1 - static_cast<int32_t>(i);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 1000 + static_cast<int32_t>(i);
  Tensor dst = Tensor::from_ints(d, {batch * dst_rows, width});
  ops::copy_row_block(Tensor::from_ints(s, {batch * src_rows, width}), dst, batch, row0, Stream::cpu());
  const std::vector<int32_t> got = dst.to_ints(Stream::cpu());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < dst_rows; ++r)
      for (int64_t c = 0; c < width; ++c) {
        const size_t k = static_cast<size_t>((b * dst_rows + r) * width + c);
        const bool inside = r >= row0 && r < row0 + src_rows;
        const int32_t want = inside ? s[static_cast<size_t>((b * src_rows + r - row0) * width + c)] : d[k];
        EXPECT_EQ(got[k], want) << "batch row " << b << ", row " << r << ", column " << c;
      }
}

TEST(RowBlock, RefusesABlockPastTheEndAndMismatchedWidths) {
  Tensor dst = Tensor::zeros({10, 4}, DType::F32, Stream::cpu());
  Tensor src = Tensor::zeros({4, 4}, DType::F32, Stream::cpu());
  EXPECT_THROW(ops::copy_row_block(src, dst, 2, 4, Stream::cpu()), Error);  // rows [4, 6) of 5
  Tensor narrow = Tensor::zeros({4, 3}, DType::F32, Stream::cpu());
  EXPECT_THROW(ops::copy_row_block(narrow, dst, 2, 0, Stream::cpu()), Error);
  EXPECT_NO_THROW(ops::copy_row_block(src, dst, 2, 3, Stream::cpu()));
}

TEST(RowBlock, ReadsEachBatchRowsBlockFromItsOffset) {
  const int64_t batch = 3, src_rows = 5, dst_rows = 2, width = 4, row0 = 3;
  std::vector<int32_t> s(static_cast<size_t>(batch * src_rows * width));
  for (size_t i = 0; i < s.size(); ++i) s[i] = 1000 + static_cast<int32_t>(i);
  Tensor dst = Tensor::zeros({batch * dst_rows, width}, DType::I32, Stream::cpu());
  ops::read_row_block(Tensor::from_ints(s, {batch * src_rows, width}), dst, batch, row0, Stream::cpu());
  const std::vector<int32_t> got = dst.to_ints(Stream::cpu());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < dst_rows; ++r)
      for (int64_t c = 0; c < width; ++c)
        EXPECT_EQ(got[static_cast<size_t>((b * dst_rows + r) * width + c)],
                  s[static_cast<size_t>((b * src_rows + row0 + r) * width + c)])
            << "batch row " << b << ", row " << r << ", column " << c;
  Tensor src = Tensor::zeros({10, 4}, DType::F32, Stream::cpu()), two = Tensor::zeros({4, 4}, DType::F32, Stream::cpu());
  EXPECT_THROW(ops::read_row_block(src, two, 2, 4, Stream::cpu()), Error);  // rows [4, 6) of 5
  EXPECT_NO_THROW(ops::read_row_block(src, two, 2, 3, Stream::cpu()));
}
