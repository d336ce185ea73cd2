// core/event.h on the CPU: host work is complete when queued, so every event call is a no-op
// that reports completion; a CPU event cannot mark a CUDA stream, and without the CUDA backend a
// CUDA event says which build option is missing. (CUDA events: tests/gpu/test_event.cpp.)
#include <gtest/gtest.h>
#include "megadlm/core/error.h"
#include "megadlm/core/event.h"

using namespace megadlm;

TEST(Event, OnTheCpuEverythingIsAlreadyComplete) {
  Event e = Event::create(Device::cpu());
  const Stream s = Stream::cpu();
  e.record(s);
  e.wait_on(s);
  EXPECT_TRUE(e.query());
  e.synchronize();
  EXPECT_EQ(e.device(), Device::cpu());
  Event default_constructed;
  EXPECT_TRUE(default_constructed.query());
}

TEST(Event, ACudaEventWithoutTheCudaBackendNamesTheOption) {
  if (cuda_compiled()) GTEST_SKIP() << "this build has the CUDA backend";
  try {
    Event::create(Device::cuda(0));
    ADD_FAILURE() << "created a CUDA event without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MEGADLM_WITH_CUDA"), std::string::npos) << e.what();
  }
}
