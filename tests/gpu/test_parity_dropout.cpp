// Dropout parity: the CUDA mask must be bit-for-bit the CPU mask (both evaluate
// ops/dropout_mask.h) at p = 0.1, for aligned and unaligned column offsets, several samples per
// tensor and non-zero sample/position offsets; values then match within bf16 rounding, and the
// f32 backward (a single multiply) matches exactly.
#include <gtest/gtest.h>
#include "megadlm/ops/dropout.h"
#include "parity.h"

using namespace megadlm;
using namespace megadlm::test::parity;

namespace {

/// Kept elements of out = residual + dropout(x): x is drawn from [0.5, 1] so a kept element
/// changes its residual (|x / (1 - p)| >= 0.55 > one bf16 ulp of |residual| <= 1) and a dropped
/// one leaves it exactly as is, on both backends.
std::vector<bool> kept_of(const std::vector<double>& out, const std::vector<float>& residual) {
  std::vector<bool> kept(out.size());
  for (size_t i = 0; i < out.size(); ++i) kept[i] = out[i] != static_cast<double>(residual[i]);
  return kept;
}

void check(int64_t rows, int64_t cols, const ops::DropoutArgs& args, DType dt) {
  Stream gpu = gpu_stream();
  const std::string tag = detail::concat("dropout p=", args.p, " [", rows, ", ", cols, "] seq ",
                                         args.seq_len, " offsets (", args.sample_offset, ", ",
                                         args.position_offset, ", ", args.column_offset, ") ",
                                         dtype_name(dt));
  Input x = make_input({rows, cols}, dt, gpu, 0.5f, 1.0f);
  Input residual = make_input({rows, cols}, dt, gpu);
  Tensor out = poisoned({rows, cols}, dt, gpu), out_ref = poisoned_host({rows, cols});
  ops::dropout_add_forward(x.device, residual.device, out, args, gpu);
  ops::dropout_add_forward(x.host, residual.host, out_ref, args, Stream::cpu());
  const std::vector<double> got = download(out, gpu), want = test::to_doubles(out_ref);
  const std::vector<bool> mask = kept_of(got, residual.values), mask_ref = kept_of(want, residual.values);
  size_t differ = 0, kept = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    differ += mask[i] != mask_ref[i];
    kept += mask_ref[i];
  }
  std::printf("[parity] %-58s mask: %zu of %zu differ, kept fraction %.4f\n", tag.c_str(), differ,
              mask.size(), static_cast<double>(kept) / static_cast<double>(mask.size()));
  EXPECT_EQ(differ, 0u) << tag;
  // bf16: one rounding of residual + x * scale; f32: the same fp32 expression (or one FMA).
  expect_close(tag + " forward values", got, want,
               dt == DType::BF16 ? test::kBf16ParityRelL2 : test::kF32ElementwiseRelL2);

  Input dout = make_input({rows, cols}, dt, gpu);
  Tensor dx = poisoned({rows, cols}, dt, gpu), dx_ref = poisoned_host({rows, cols});
  ops::dropout_backward(dout.device, dx, args, gpu);
  ops::dropout_backward(dout.host, dx_ref, args, Stream::cpu());
  // f32: dout * (1 / (1 - p)) in fp32 on both sides, dropped elements exactly 0: bit-equal.
  expect_close(tag + " backward", download(dx, gpu), test::to_doubles(dx_ref),
               dt == DType::BF16 ? test::kBf16ParityRelL2 : 0.0);
}

}  // namespace

TEST(DropoutParity, CudaMaskEqualsCpuMaskBitForBit) {
  MDLM_REQUIRE_GPU();
  const ops::DropoutArgs aligned{.p = 0.1f, .seed = 0x5eed, .site = 7, .seq_len = 512,
                                 .sample_offset = 3, .position_offset = 0, .column_offset = 0};
  check(2048, 2048, aligned, DType::BF16);  // 4 samples of 512 positions
  check(2048, 2048, aligned, DType::F32);
  const ops::DropoutArgs tp_shard{.p = 0.1f, .seed = 99, .site = 2, .seq_len = 7,
                                  .sample_offset = 5, .position_offset = 2, .column_offset = 1024};
  check(301, 512, tp_shard, DType::BF16);
  const ops::DropoutArgs unaligned{.p = 0.1f, .seed = 1234567, .site = 1, .seq_len = 13,
                                   .sample_offset = 11, .position_offset = 4, .column_offset = 3};
  check(257, 1001, unaligned, DType::BF16);
  check(70000, 5, unaligned, DType::F32);  // more rows than the grid's 65535 y-blocks
}

TEST(DropoutParity, ContextParallelChunkMapsMatchCpuBitForBit) {
  MDLM_REQUIRE_GPU();
  // A CP rank's shard: 4 samples of 256 local positions, chunks 1 and 6 of 128 (rank 1 of 4 of
  // a 1024-token sequence), and under SP a row shard of it.
  ops::DropoutArgs cp_shard{.p = 0.1f, .seed = 0xc0ffee, .site = 5, .seq_len = 256,
                            .sample_offset = 8, .position_offset = 0, .column_offset = 0};
  cp_shard.chunks = ops::ChunkMap{128, 1, 6};
  check(1024, 512, cp_shard, DType::BF16);
  cp_shard.row_offset = 300;
  check(301, 1000, cp_shard, DType::F32);
}

