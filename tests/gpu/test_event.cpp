// core/event.h on a GPU: an event recorded behind queued work completes with it, makes another
// stream wait on the device, and its query() turns true once the work is done.
#include <gtest/gtest.h>
#include "megadlm/core/event.h"
#include "megadlm/ops/elementwise.h"
#include "support/op_testing.h"

using namespace megadlm;

TEST(Event, OrdersTwoCudaStreamsAndReportsCompletion) {
  MDLM_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Stream producer = Stream::create(dev), consumer = Stream::create(dev);
  Tensor big = Tensor::empty({int64_t{64} << 20}, DType::F32, producer);  // 256 MiB: takes a while
  ops::fill(big, 3.0f, producer);
  Tensor tail = big.slice_flat(big.numel() - 4, {4});
  Event done = Event::create(dev);
  done.record(producer);
  done.wait_on(consumer);  // the consumer's copy below must see the fill
  Tensor copy = Tensor::empty({4}, DType::F32, consumer);
  copy_tensor(tail, copy, consumer);
  EXPECT_EQ(copy.to_floats(consumer), (std::vector<float>{3, 3, 3, 3}));
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_EQ(done.device(), dev);
  EXPECT_THROW(done.record(Stream::cpu()), Error);
}
