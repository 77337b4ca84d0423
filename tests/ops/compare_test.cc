#include "ops/common/compare.h"

#include <cmath>

#include <gtest/gtest.h>

#include "ops/rms_norm/reference.h"

namespace kjit::ops {
namespace {

TEST(CompareTest, AcceptsWithinAndRejectsBeyondTolerance) {
  const std::vector<double> ref = {1.0, -2.0, 0.5, 0.0};
  EXPECT_TRUE(Compare({1.0 + 1e-3, -2.0, 0.5, 1e-7}, ref, {1.1e-3, 1e-6}).ok);
  const CompareResult r = Compare({1.0 + 2e-3, -2.0, 0.5, 0.0}, ref, {1.1e-3, 1e-6});
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.mismatches, 1);
  EXPECT_EQ(r.first_bad, 0);
}

TEST(CompareTest, NanAndInfMustMatchExactly) {
  EXPECT_TRUE(Compare({NAN, INFINITY, -INFINITY}, {NAN, INFINITY, -INFINITY}, {0.1, 0.1}).ok);
  EXPECT_FALSE(Compare({NAN}, {1.0}, {1e9, 1e9}).ok) << "NaN never passes against a number";
  EXPECT_FALSE(Compare({1.0}, {NAN}, {1e9, 1e9}).ok);
  EXPECT_FALSE(Compare({INFINITY}, {-INFINITY}, {1e9, 1e9}).ok);
  EXPECT_FALSE(Compare({1e300}, {INFINITY}, {1e9, 1e9}).ok);
}

TEST(CompareTest, PerElementAtolAddsToTheScalar) {
  EXPECT_TRUE(Compare({0.1, 0.0}, {0.0, 0.0}, {0, 0.0}, {0.2, 0.0}).ok);
  EXPECT_FALSE(Compare({0.0, 0.1}, {0.0, 0.0}, {0, 0.05}, {0.2, 0.0}).ok);
  EXPECT_TRUE(Compare({0.0, 0.1}, {0.0, 0.0}, {0, 0.05}, {0.2, 0.06}).ok);
}

TEST(CompareTest, SizeMismatchFails) { EXPECT_FALSE(Compare({1.0}, {1.0, 2.0}, {1, 1}).ok); }

// The RMSNorm tolerances must reject an all-zero gradient and a slightly perturbed output.
TEST(CompareTest, RmsNormChecksRejectZeroAndPerturbedOutputs) {
  const RmsNormMath m{.hidden = 256, .dtype = DType::kBF16, .eps = 1e-6};
  const int64_t rows = 64;
  std::vector<double> x(rows * m.hidden), dy(rows * m.hidden), w(m.hidden);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.37 * i) * 2;
    dy[i] = std::cos(0.11 * i);
  }
  for (size_t i = 0; i < w.size(); ++i) w[i] = 1 + 0.1 * std::sin(1.3 * i);
  const auto f = RmsNormForwardReference(m, rows, x, nullptr, w);
  const auto b = RmsNormBackwardReference(m, rows, dy, x, w, nullptr);
  // The references themselves pass.
  for (const auto& [name, r] : CheckRmsNorm(
           m, rows, DType::kBF16, {.y = &f.y, .rstd = &f.rstd, .dx = &b.dx, .dw = &b.dw}, f, &b)) {
    EXPECT_TRUE(r.ok) << r.Describe(name);
  }
  const std::vector<double> zeros_dx(b.dx.size(), 0.0), zeros_dw(b.dw.size(), 0.0);
  auto zero = CheckRmsNorm(m, rows, DType::kBF16, {.dx = &zeros_dx, .dw = &zeros_dw}, f, &b);
  ASSERT_EQ(zero.size(), 2u);
  EXPECT_FALSE(zero[0].second.ok) << "an all-zero dx passes";
  EXPECT_FALSE(zero[1].second.ok) << "an all-zero dw passes";
  // 2% off in one element of y (bf16 keeps about 0.4%).
  std::vector<double> y = f.y;
  y[100] *= 1.02;
  EXPECT_FALSE(CheckRmsNorm(m, rows, DType::kBF16, {.y = &y}, f, nullptr)[0].second.ok);
  std::vector<double> dx = b.dx;
  dx[77] += 0.05 * std::fabs(dx[77]) + 1e-3;
  EXPECT_FALSE(CheckRmsNorm(m, rows, DType::kBF16, {.dx = &dx}, f, &b)[0].second.ok);
}

}  // namespace
}  // namespace kjit::ops
