#include "ops/common/tuning/compare.h"

#include <cmath>

#include <gtest/gtest.h>

#include "kjit/host_convert.h"
#include "ops/rms_norm/tuning/reference.h"

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

// Issue 45, defect 15: `kjit bench` on kernels that wrote NaN said "got -nan ... worst 0x
// tolerance"; the ratio is over finite elements, so a NaN is named as such.
TEST(CompareTest, DescribesNanMismatchesAsSuch) {
  const double minus_nan = std::copysign(NAN, -1.0);
  const CompareResult nan_only = Compare({0.5, minus_nan, minus_nan}, {0.5, 0.25, 1.0}, {0, 1e-3});
  EXPECT_EQ(nan_only.Describe("loss"),
            "loss: 2 of 3 elements out of tolerance; first at 1: got NaN expected 0.25; 2 NaN or "
            "infinite where the reference is not (or the other way)");
  CompareResult both = Compare({1.0, 2.0}, {1.0, 2.5}, {0, 0.1});
  both.Merge(nan_only, 2);
  EXPECT_EQ(both.Describe("grad"),
            "grad: 3 of 5 elements out of tolerance; first at 1: got 2 expected 2.5; 2 NaN or "
            "infinite where the reference is not (or the other way); worst 5x tolerance among the "
            "finite");
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

// Casting none's check is tight enough to tell its rounding points apart: a kernel that computed
// rstd in fp32 (no rounding), or y without rounding x * rstd, fails; one whose rstd rounded a
// near-tie mean the other way passes once the reference is given that rstd.
TEST(CompareTest, RmsNormCastingNoneCheckSeesEveryRounding) {
  const RmsNormMath m{
      .hidden = 1024, .dtype = DType::kBF16, .eps = 1e-6, .casting = RmsNormCasting::kNone};
  const int64_t rows = 32, n = rows * m.hidden;
  std::vector<double> x(n), dy(n), w(m.hidden);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = RoundTo(std::sin(0.37 * i) * 2, m.dtype);
    dy[i] = RoundTo(std::cos(0.11 * i), m.dtype);
  }
  for (int64_t i = 0; i < m.hidden; ++i) w[i] = RoundTo(1 + 0.1 * std::sin(1.3 * i), m.dtype);
  const auto f = RmsNormForwardReference(m, rows, x, nullptr, w);
  const auto b = RmsNormBackwardReference(m, rows, dy, x, w, nullptr);
  auto all_ok = [&](const RmsNormOutputs& out, const RmsNormForwardResult& fwd) {
    bool ok = true;
    for (const auto& [name, r] : CheckRmsNorm(m, rows, m.dtype, out, fwd, &b)) ok &= r.ok;
    return ok;
  };
  // What a correct kernel stores passes: y rounded to the dtype, rstd the reference's.
  std::vector<double> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = RoundTo(f.y[i], m.dtype);
  EXPECT_TRUE(all_ok({.y = &y, .rstd = &f.rstd, .dx = &b.dx, .dw = &b.dw}, f));
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_EQ(RoundTo(f.rstd[i], m.dtype), f.rstd[i]) << "rstd is a value of the dtype";
    EXPECT_LE(f.rstd_lo[i], f.rstd[i]);
    EXPECT_GE(f.rstd_hi[i], f.rstd[i]);
  }

  // rstd in fp32, as llama and gemma compute it: not a value of the dtype, so refused.
  const RmsNormMath fp32_rstd{.hidden = m.hidden, .dtype = m.dtype, .eps = m.eps};
  const auto llama = RmsNormForwardReference(fp32_rstd, rows, x, nullptr, w);
  EXPECT_FALSE(all_ok({.rstd = &llama.rstd}, f));
  // y with x * rstd left unrounded (gemma's y with none's rstd) differs somewhere by more than
  // the final rounding.
  const RmsNormMath gemma{
      .hidden = m.hidden, .dtype = m.dtype, .eps = m.eps, .casting = RmsNormCasting::kGemma};
  const auto unrounded = RmsNormForwardReference(gemma, rows, x, nullptr, w, &f.rstd);
  for (int64_t i = 0; i < n; ++i) y[i] = RoundTo(unrounded.y[i], m.dtype);
  EXPECT_FALSE(all_ok({.y = &y}, f));
  // An rstd one ulp off where the sum is far from a tie is refused.
  std::vector<double> off = f.rstd;
  int64_t far = -1;
  for (int64_t i = 0; i < rows && far < 0; ++i) {
    if (f.rstd_lo[i] == f.rstd_hi[i]) far = i;
  }
  ASSERT_GE(far, 0) << "every row near a tie";
  off[far] = RoundTo(off[far] * (1 + std::ldexp(1.0, -7)), m.dtype);
  ASSERT_NE(off[far], f.rstd[far]);
  EXPECT_FALSE(all_ok({.rstd = &off}, f));
  // The same rstd handed to the reference (as the GPU tests do with the kernel's) moves y with it.
  const auto with_off = RmsNormForwardReference(m, rows, x, nullptr, w, &off);
  for (int64_t i = 0; i < n; ++i) y[i] = RoundTo(with_off.y[i], m.dtype);
  EXPECT_TRUE(all_ok({.y = &y}, with_off));
  EXPECT_FALSE(all_ok({.y = &y}, f));

  // fp32: casting none equals llama up to fp32 rounding.
  const RmsNormMath none32{
      .hidden = m.hidden, .dtype = DType::kF32, .eps = m.eps, .casting = RmsNormCasting::kNone};
  const RmsNormMath llama32{.hidden = m.hidden, .dtype = DType::kF32, .eps = m.eps};
  const auto a = RmsNormForwardReference(none32, rows, x, nullptr, w);
  const auto c = RmsNormForwardReference(llama32, rows, x, nullptr, w);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(a.y[i], c.y[i], 1e-6 * std::fabs(c.y[i]) + 1e-30);
}

}  // namespace
}  // namespace kjit::ops
