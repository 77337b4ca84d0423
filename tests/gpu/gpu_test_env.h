// Shared by the GPU suites: one Runtime for the whole process, and a visible skip without a GPU.
//
//   TEST(RmsNormGpu, Forward) {
//     KJIT_REQUIRE_GPU(rt);     // GTEST_SKIP()s with the driver's reason when there is no GPU
//     ...
//   }
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "jit/status_helpers.h"
#include "kjit/kjit.h"

namespace kjit::testing {

// The process's GPU runtime, or the reason there is none.
const absl::StatusOr<Runtime>& GpuRuntime();

// Targets as the bytes of an int32 or int64 device vector, and back (argmax).
std::vector<unsigned char> IndexBytes(const std::vector<int64_t>& v, IndexType t);
std::vector<double> IndexValues(const std::vector<unsigned char>& bytes, IndexType t);
// A new buffer of max(image, bytes, 16) bytes holding `image`, the rest 0xFF (NaN in every float
// type, so that an output left unwritten shows).
absl::StatusOr<DeviceBuffer> Upload(const Runtime& rt, const std::vector<unsigned char>& image,
                                    size_t bytes = 0);
// The first `bytes` of a buffer.
absl::StatusOr<std::vector<unsigned char>> Download(const DeviceBuffer& b, size_t bytes);

}  // namespace kjit::testing

#define KJIT_REQUIRE_GPU(rt)                                                   \
  const auto& kjit_gpu_ = ::kjit::testing::GpuRuntime();                       \
  if (!kjit_gpu_.ok()) {                                                       \
    GTEST_SKIP() << "no GPU: " << ::kjit::ToStd(kjit_gpu_.status().message()); \
  }                                                                            \
  [[maybe_unused]] const ::kjit::Runtime& rt = *kjit_gpu_

// Statuses in GPU tests: the test stops with the status printed.
#define ASSERT_OK(expr)             \
  do {                              \
    const absl::Status s_ = (expr); \
    ASSERT_TRUE(s_.ok()) << s_;     \
  } while (0)
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                                \
  auto KJIT_CONCAT(so_, __LINE__) = (expr);                                            \
  ASSERT_TRUE(KJIT_CONCAT(so_, __LINE__).ok()) << KJIT_CONCAT(so_, __LINE__).status(); \
  lhs = std::move(*KJIT_CONCAT(so_, __LINE__))
