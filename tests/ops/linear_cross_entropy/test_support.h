// What the fused linear + cross-entropy's CPU tests (tests/ops/linear_cross_entropy/) share: a
// valid spec (Llama 3's vocab and hidden size in bf16), a check that a status's message names
// something, and a fixture holding a compile-only sm_90 runtime to make the op on.
//
//   TEST_F(LinearCrossEntropyRuntimeTest, Builds) { auto op = rt_->LinearCrossEntropy(Good()); }
#pragma once

#include <optional>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/linear_cross_entropy.h"
#include "kjit/runtime.h"

namespace kjit::testing {

inline bool Contains(const absl::Status& s, const std::string& needle) {
  return ToStd(s.message()).find(needle) != std::string::npos;
}

inline LinearCrossEntropySpec Good() {
  return {.vocab = 128256, .hidden = 4096, .dtype = DType::kBF16};
}

class LinearCrossEntropyRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto rt = Runtime::Create(
        {.target = "sm_90", .compile_only = true, .disk_cache = false, .tuning_db = "off"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_.emplace(std::move(*rt));
  }
  std::optional<Runtime> rt_;
};

}  // namespace kjit::testing
