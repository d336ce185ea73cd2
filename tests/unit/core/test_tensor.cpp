#include <gtest/gtest.h>
#include "megadlm/core/stream.h"
#include "megadlm/core/tensor.h"

using namespace megadlm;

TEST(Tensor, NarrowAndViewShareStorage) {
  Tensor t = Tensor::from_floats({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor row1 = t.narrow(1, 1);
  EXPECT_EQ(row1.shape(), (Shape{1, 2}));
  EXPECT_EQ(row1.data<float>()[0], 2.0f);
  row1.data<float>()[1] = 42.0f;
  EXPECT_EQ(t.data<float>()[3], 42.0f);
  Tensor flat = t.view({6});
  EXPECT_EQ(flat.size(0), 6);
  EXPECT_THROW(t.view({4}), Error);
  EXPECT_THROW(t.narrow(2, 2), Error);
}

TEST(Tensor, ConvertsBetweenDtypesOnTheHost) {
  Tensor t = Tensor::from_floats({1.0f, -2.5f, 3.140625f, 1e-3f}, {4});
  Tensor b = t.to(Device::cpu(), DType::BF16, Stream::cpu());
  std::vector<float> back = b.to_floats(Stream::cpu());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_EQ(back[2], 3.140625f);             // exactly representable in bf16
  EXPECT_NEAR(back[3], 1e-3f, 1e-3f / 128);  // 8 bits of mantissa
  Tensor h = t.to(Device::cpu(), DType::F16, Stream::cpu());
  EXPECT_EQ(h.to_floats(Stream::cpu())[1], -2.5f);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between two bf16 values; it rounds to the even one (1.0).
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
}

TEST(Tensor, WrongDtypeAccessIsAnError) {
  Tensor t = Tensor::zeros({2}, DType::I32, Stream::cpu());
  EXPECT_THROW(t.data<float>(), Error);
  try {
    t.data<float>();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos);
  }
}

// A host allocation that fails said "check failed: p != nullptr". It names the
// tensor's shape, dtype and bytes, what megadlm's host tensors hold already, the machine's memory
// and what to change.
TEST(Tensor, FailedHostAllocationSaysWhatHowMuchAndWhatToChange) {
  try {
    // 4 PiB: more than any address space gives.
    (void)Tensor::empty({1 << 20, 1 << 20, 1024}, DType::F32, Stream::cpu());
    ADD_FAILURE() << "a 4 PiB host tensor was allocated";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("check failed"), std::string::npos) << what;
    for (const char* says : {"out of host memory", "f32[1048576, 1048576, 1024]", "4503599627370496 bytes",
                             "4.0 PiB", "held by megadlm's host tensors", "this machine has",
                             "--micro-batch-size", "--recompute-activations", "--dry-run"})
      EXPECT_NE(what.find(says), std::string::npos) << says << " not in: " << what;
  }
}

// The total named in that message: the bytes of the host tensors alive now.
TEST(Tensor, CountsTheHostBytesItHolds) {
  const int64_t before = host_bytes_in_use();
  {
    const Tensor t = Tensor::empty({1000}, DType::F32, Stream::cpu());
    EXPECT_EQ(host_bytes_in_use(), before + 4032);  // rounded up to 64-byte lines
  }
  EXPECT_EQ(host_bytes_in_use(), before);
}
