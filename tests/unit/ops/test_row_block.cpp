// ops::copy_row_block on the CPU: every batch row's block lands at its offset, the rest of dst is
// untouched, and bad shapes are refused by name.
#include <gtest/gtest.h>
#include "megadlm/core/error.h"
#include "megadlm/ops/row_block.h"
#include <utility>
#include <vector>

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

// ops::add_row_block: dst's rows [row0, row0 + n) of each batch row += src, summed in f32 (f64)
// and rounded once to dst's dtype; the CPU path is the CUDA kernel's reference (bit for bit).
TEST(RowBlock, AddsEachBatchRowsBlockAtItsOffsetAndNothingElse) {
  const int64_t batch = 3, dst_rows = 6, src_rows = 2, width = 5, row0 = 3;
  Tensor dst = Tensor::empty({batch * dst_rows, width}, DType::F32, Stream::cpu());
  Tensor src = Tensor::empty({batch * src_rows, width}, DType::F32, Stream::cpu());
  std::vector<float> d0(static_cast<size_t>(dst.numel()));
  for (int64_t i = 0; i < dst.numel(); ++i) dst.data<float>()[i] = d0[static_cast<size_t>(i)] = -1.0f - static_cast<float>(i);
  for (int64_t i = 0; i < src.numel(); ++i) src.data<float>()[i] = 1000.0f * static_cast<float>(i + 1);
  ops::add_row_block(src, dst, batch, row0, Stream::cpu());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < dst_rows; ++r)
      for (int64_t c = 0; c < width; ++c) {
        const int64_t k = (b * dst_rows + r) * width + c;
        const bool inside = r >= row0 && r < row0 + src_rows;
        const float want = d0[static_cast<size_t>(k)] +
                           (inside ? src.data<float>()[(b * src_rows + r - row0) * width + c] : 0.0f);
        EXPECT_EQ(dst.data<float>()[k], want) << "batch row " << b << ", row " << r << ", column " << c;
      }
  // Rows past the end, another dtype, another width: refused.
  EXPECT_THROW(ops::add_row_block(src, dst, batch, 5, Stream::cpu()), Error);
  Tensor f64 = Tensor::zeros({batch * src_rows, width}, DType::F64, Stream::cpu());
  EXPECT_THROW(ops::add_row_block(f64, dst, batch, 0, Stream::cpu()), Error);
  Tensor narrow = Tensor::zeros({batch * src_rows, width - 1}, DType::F32, Stream::cpu());
  EXPECT_THROW(ops::add_row_block(narrow, dst, batch, 0, Stream::cpu()), Error);
  Tensor ints = Tensor::zeros({batch * src_rows, width}, DType::I32, Stream::cpu()),
         int_dst = Tensor::zeros({batch * dst_rows, width}, DType::I32, Stream::cpu());
  EXPECT_THROW(ops::add_row_block(ints, int_dst, batch, 0, Stream::cpu()), Error);
}

TEST(RowBlock, AddsBf16InF32AndRoundsOnceToNearestEven) {
  // bf16 has 8 significant bits: at 1.0 one step is 2^-7. 1 + 0.75 step rounds up (truncating
  // would keep 1); 1 + 0.5 step is a tie that goes to the even 1.0; (1 + 1 step) + 0.5 step to
  // the even 1 + 2 steps. The last pair: summed in f32 then rounded once, not rounded per addend.
  const float step = 1.0f / 128;
  const std::vector<std::pair<float, float>> cases = {
      {1.0f, 0.75f * step}, {1.0f, 0.5f * step}, {1.0f + step, 0.5f * step}, {-3.0f, 0.0078125f}, {256.0f, 1.5f}};
  const std::vector<float> want = {1.0f + step, 1.0f, 1.0f + 2 * step, round_to_bf16(-3.0f + 0.0078125f), 258.0f};
  const int64_t n = static_cast<int64_t>(cases.size());
  // One batch row of n + 2 rows of width 1; the block is rows [1, n + 1).
  Tensor dst = Tensor::empty({n + 2, 1}, DType::BF16, Stream::cpu()), src = Tensor::empty({n, 1}, DType::BF16, Stream::cpu());
  bf16_t* d = dst.data<bf16_t>();
  d[0] = bf16_t::from_float(7.0f);
  d[n + 1] = bf16_t::from_float(-7.0f);
  for (int64_t i = 0; i < n; ++i) {
    d[i + 1] = bf16_t::from_float(cases[static_cast<size_t>(i)].first);
    src.data<bf16_t>()[i] = bf16_t::from_float(cases[static_cast<size_t>(i)].second);
    ASSERT_EQ(d[i + 1].to_float(), cases[static_cast<size_t>(i)].first);  // exact bf16 inputs
    ASSERT_EQ(src.data<bf16_t>()[i].to_float(), cases[static_cast<size_t>(i)].second);
  }
  ops::add_row_block(src, dst, 1, 1, Stream::cpu());
  EXPECT_EQ(d[0].to_float(), 7.0f);
  EXPECT_EQ(d[n + 1].to_float(), -7.0f);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(d[i + 1].to_float(), want[static_cast<size_t>(i)]) << "case " << i;
}
