// The fused linear + cross-entropy's check against its fp64 reference
// (ops/linear_cross_entropy/tuning/reference.h), without a GPU.
#include "kjit/linear_cross_entropy.h"

#include <vector>

#include <gtest/gtest.h>

#include "ops/linear_cross_entropy/tuning/reference.h"

namespace kjit {
namespace {

// The argmax check accepts a column whose exact logit is within twice the row's logit error
// (logit_error is per row) of the largest, and rejects one further off. A GPU run (H100,
// 2026-12-05) failed LinearCrossEntropyGpu.EveryOption when the check read logit_error per element.
TEST(LinearCrossEntropyCheck, ArgmaxAcceptsOnlyNearTiesWithinTheRowsLogitError) {
  ops::LinearCrossEntropyResult ref;
  ref.logits = {1.0, 3.0, 2.99, 0.0,   // row 0: columns 1 and 2 within 2 * 0.01
                5.0, 4.9, 0.0,  0.0};  // row 1: columns 0 and 1 further apart than 2 * 0.01
  ref.logit_error = {0.01, 0.01};
  ref.loss.argmax = {1, 0};
  const auto check = [&](std::vector<double> got) {
    return ops::CheckLinearCrossEntropy({.argmax = &got}, ref).at(0).second.ok;
  };
  EXPECT_TRUE(check({1, 0}));
  EXPECT_TRUE(check({2, 0})) << "a near tie may pick either";
  EXPECT_FALSE(check({1, 1})) << "0.1 apart is not a tie at an error of 0.01";
  EXPECT_FALSE(check({3, 0}));
}

}  // namespace
}  // namespace kjit
