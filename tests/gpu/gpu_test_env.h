// Shared by the GPU suites: one Runtime for the whole process, and a visible skip without a GPU.
//
//   TEST(RmsNormGpu, Forward) {
//     KJIT_REQUIRE_GPU(rt);     // GTEST_SKIP()s with the driver's reason when there is no GPU
//     ...
//   }
#pragma once

#include <gtest/gtest.h>

#include "kjit/kjit.h"

namespace kjit::testing {

// The process's GPU runtime, or the reason there is none.
const absl::StatusOr<Runtime>& GpuRuntime();

}  // namespace kjit::testing

#define KJIT_REQUIRE_GPU(rt)                                                   \
  const auto& kjit_gpu_ = ::kjit::testing::GpuRuntime();                       \
  if (!kjit_gpu_.ok()) {                                                       \
    GTEST_SKIP() << "no GPU: " << ::kjit::ToStd(kjit_gpu_.status().message()); \
  }                                                                            \
  [[maybe_unused]] const ::kjit::Runtime& rt = *kjit_gpu_
