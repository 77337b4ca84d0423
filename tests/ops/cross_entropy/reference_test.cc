// The fp64 cross-entropy reference: hand-computed values, PyTorch's semantics for ignored rows,
// label smoothing, z-loss and soft-capping, the gradient as the derivative of the loss (finite
// differences), NaN/Inf rules, and tolerances that accept the reference and reject an all-zero or
// slightly perturbed output.
#include "ops/cross_entropy/tuning/reference.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "kjit/host_convert.h"

namespace kjit::ops {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> RandomLogits(int64_t n, double scale, uint64_t seed, DType t = DType::kF32) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-1.7320508, 1.7320508);
  std::vector<double> v(n);
  for (double& x : v) x = RoundTo(scale * u(gen), t);
  return v;
}

TEST(CrossEntropyReferenceTest, HandComputedRow) {
  const CrossEntropyMath m{
      .vocab = 3, .dtype = DType::kF32, .loss = {.reduction = Reduction::kNone}};
  const auto r = CrossEntropyReference(m, 1, {1, 2, 3}, {2}, nullptr, true);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(r.lse[0], lse, 1e-15);
  EXPECT_NEAR(r.loss[0], lse - 3, 1e-15);
  EXPECT_NEAR(r.grad[0], std::exp(1 - lse), 1e-15);
  EXPECT_NEAR(r.grad[1], std::exp(2 - lse), 1e-15);
  EXPECT_NEAR(r.grad[2], std::exp(3 - lse) - 1, 1e-15);
  EXPECT_EQ(r.argmax[0], 2);
  EXPECT_EQ(r.counters, (std::vector<double>{1, 0}));
}

// Entropy -sum p ln p of the (capped) softmax for every row, the target's log-probability
// x_t - lse (= -loss without options) for valid rows and 0 for ignored ones; NaN entropy for
// rows whose lse is not finite; masked classes count as p = 0.
TEST(CrossEntropyReferenceTest, EntropyAndTargetLogprob) {
  const CrossEntropyMath m{
      .vocab = 3, .dtype = DType::kF32, .loss = {.reduction = Reduction::kNone}};
  const auto r = CrossEntropyReference(m, 4, {1, 2, 3, 0, 0, 0, 5, -kInf, 5, -kInf, -kInf, -kInf},
                                       {2, -100, 1, 0}, nullptr, false);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  double h = 0;
  for (double x : {1.0, 2.0, 3.0}) h -= std::exp(x - lse) * (x - lse);
  EXPECT_NEAR(r.entropy[0], h, 1e-15);
  EXPECT_NEAR(r.entropy[1], std::log(3.0), 1e-15);  // ignored rows too
  EXPECT_NEAR(r.entropy[2], std::log(2.0), 1e-15);  // a masked class: p = 0 adds nothing
  EXPECT_TRUE(std::isnan(r.entropy[3]));            // all masked
  EXPECT_NEAR(r.target_logprob[0], 3 - lse, 1e-15);
  EXPECT_NEAR(r.target_logprob[0], -r.loss[0], 1e-15);
  EXPECT_EQ(r.target_logprob[1], 0.0);
  EXPECT_EQ(r.target_logprob[2], -kInf);  // the target is a masked class
  // The checks accept the reference and reject a perturbed entropy.
  std::vector<double> e = r.entropy, lp = r.target_logprob;
  for (const auto& [name, c] : CheckCrossEntropy(m, {.entropy = &e, .target_logprob = &lp}, r))
    EXPECT_TRUE(c.ok) << c.Describe(name);
  e[0] += 1e-3;
  EXPECT_FALSE(CheckCrossEntropy(m, {.entropy = &e}, r)[0].second.ok);
  // With soft-capping, the entropy is the capped logits' softmax's.
  const CrossEntropyMath capped{.vocab = 3, .dtype = DType::kF32, .loss = {.softcap = 2.0}};
  const auto rc = CrossEntropyReference(capped, 1, {1, 2, 3}, {0}, nullptr, false);
  double hc = 0, sc = 0;
  for (double x : {1.0, 2.0, 3.0}) sc += std::exp(2 * std::tanh(x / 2));
  for (double x : {1.0, 2.0, 3.0}) {
    const double lp_x = 2 * std::tanh(x / 2) - std::log(sc);
    hc -= std::exp(lp_x) * lp_x;
  }
  EXPECT_NEAR(rc.entropy[0], hc, 1e-14);
  EXPECT_NEAR(rc.target_logprob[0], 2 * std::tanh(0.5) - std::log(sc), 1e-14);
}

TEST(CrossEntropyReferenceTest, IgnoredOutOfRangeAndAllIgnoredRowsFollowPyTorch) {
  CrossEntropyMath m{.vocab = 4,
                     .dtype = DType::kF32,
                     .loss = {.ignore_index = -100, .reduction = Reduction::kMean}};
  const std::vector<double> x = RandomLogits(4 * 4, 1, 1);
  // Rows: valid, ignored, out of range (4 == vocab), out of range (-1).
  const auto r = CrossEntropyReference(m, 4, x, {1, -100, 4, -1}, nullptr, true);
  EXPECT_EQ(r.counters, (std::vector<double>{1, 2}));
  EXPECT_EQ(r.row_loss[1], 0);
  EXPECT_EQ(r.row_loss[2], 0);
  EXPECT_DOUBLE_EQ(r.loss[0], r.row_loss[0]) << "the mean is over the one valid row";
  for (int64_t k = 4; k < 16; ++k) EXPECT_EQ(r.grad[k], 0) << k;
  EXPECT_TRUE(std::isfinite(r.lse[1])) << "lse is written for ignored rows too";

  // Every row ignored: mean is 0/0 = NaN, sum is 0, the gradient is zero.
  const auto all = CrossEntropyReference(m, 2, RandomLogits(8, 1, 2), {-100, -100}, nullptr, true);
  EXPECT_TRUE(std::isnan(all.loss[0]));
  for (double g : all.grad) EXPECT_EQ(g, 0);
  m.loss.reduction = Reduction::kSum;
  EXPECT_EQ(CrossEntropyReference(m, 2, RandomLogits(8, 1, 2), {-100, -100}, nullptr, true).loss[0],
            0);
  // ignore_index may name a real class.
  m.loss.ignore_index = 2;
  const auto cls = CrossEntropyReference(m, 1, RandomLogits(4, 1, 3), {2}, nullptr, true);
  EXPECT_EQ(cls.counters, (std::vector<double>{0, 0}));
}

TEST(CrossEntropyReferenceTest, OptionsMatchTheirDefinitions) {
  const int64_t V = 5;
  const std::vector<double> x = {0.5, -1.0, 2.0, 0.25, -0.75};
  const double eps = 0.1f, z = 1e-2f, cap = 1.5;  // as the float options hold them
  CrossEntropyMath m{.vocab = V,
                     .dtype = DType::kF32,
                     .loss = {.reduction = Reduction::kNone,
                              .label_smoothing = static_cast<float>(eps),
                              .z_loss = static_cast<float>(z),
                              .softcap = static_cast<float>(cap)}};
  const auto r = CrossEntropyReference(m, 1, x, {3}, nullptr, false);
  double s = 0, mean = 0;
  std::vector<double> c(V);
  for (int j = 0; j < V; ++j) {
    c[j] = cap * std::tanh(x[j] / cap);
    s += std::exp(c[j]);
    mean += c[j] / V;
  }
  const double lse = std::log(s);
  // PyTorch: (1 - eps) * nll + eps * mean_j(-log_softmax_j), plus z * lse^2 (PaLM's z-loss).
  const double expected = (1 - eps) * (lse - c[3]) + eps * (lse - mean) + z * lse * lse;
  EXPECT_NEAR(r.loss[0], expected, 1e-14);
  EXPECT_NEAR(r.lse[0], lse, 1e-14);
}

// The gradient is the derivative of the loss, for every option and reduction.
TEST(CrossEntropyReferenceTest, GradientIsTheDerivativeOfTheLoss) {
  const int64_t V = 7, R = 3;
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    for (int bits = 0; bits < 8; ++bits) {
      CrossEntropyMath m{.vocab = V, .dtype = DType::kF32, .loss = {.reduction = red}};
      if (bits & 1) m.loss.label_smoothing = 0.2;
      if (bits & 2) m.loss.z_loss = 0.05;
      if (bits & 4) m.loss.softcap = 2.0;
      const std::vector<double> x = RandomLogits(R * V, 3, 10 + bits);
      const std::vector<int64_t> t = {6, -100, 0};
      const std::vector<double> up =
          red == Reduction::kNone ? std::vector<double>{0.5, 2, -1.5} : std::vector<double>{0.75};
      const auto r = CrossEntropyReference(m, R, x, t, &up, true);
      // d/dx of sum_i up_i * loss_i (none) or up * loss (sum, mean).
      auto objective = [&](const std::vector<double>& xs) {
        const auto f = CrossEntropyReference(m, R, xs, t, nullptr, false);
        double o = 0;
        for (size_t i = 0; i < f.loss.size(); ++i) o += up[i] * f.loss[i];
        return o;
      };
      for (int64_t k = 0; k < R * V; ++k) {
        const double h = 1e-6;
        std::vector<double> a = x, b = x;
        a[k] += h;
        b[k] -= h;
        const double fd = (objective(a) - objective(b)) / (2 * h);
        EXPECT_NEAR(r.grad[k], fd, 1e-7 * (1 + std::fabs(fd)))
            << "reduction " << Name(red) << " options " << bits << " element " << k;
      }
    }
  }
}

TEST(CrossEntropyReferenceTest, NanAndInfRules) {
  const CrossEntropyMath m{
      .vocab = 4, .dtype = DType::kF32, .loss = {.reduction = Reduction::kNone}};
  const std::vector<double> x = {
      0.5,   kNaN,  1.0,   kNaN,    // NaN: lse, loss, gradient NaN; argmax the first NaN
      0.5,   kInf,  1.0,   0.0,     // +Inf: NaN as well (Inf - Inf)
      -kInf, 1.0,   1.0,   -kInf,   // -Inf: masked classes, probability 0; argmax the first max
      -kInf, -kInf, -kInf, -kInf};  // all masked: lse -Inf, loss NaN
  const auto r = CrossEntropyReference(m, 4, x, {0, 0, 1, 0}, nullptr, true);
  EXPECT_TRUE(std::isnan(r.lse[0]));
  EXPECT_TRUE(std::isnan(r.loss[0]));
  EXPECT_EQ(r.argmax[0], 1);
  for (int j = 0; j < 4; ++j) EXPECT_TRUE(std::isnan(r.grad[j]));
  EXPECT_TRUE(std::isnan(r.lse[1]));
  EXPECT_EQ(r.argmax[1], 1);
  EXPECT_NEAR(r.lse[2], 1 + std::log(2.0), 1e-15);
  EXPECT_EQ(r.grad[8], 0);
  EXPECT_NEAR(r.grad[9], -0.5, 1e-15);
  EXPECT_NEAR(r.grad[10], 0.5, 1e-15);
  EXPECT_EQ(r.argmax[2], 1);
  EXPECT_EQ(r.lse[3], -kInf);
  EXPECT_TRUE(std::isnan(r.loss[3]));
  EXPECT_EQ(r.argmax[3], 0);
  // With a soft cap, infinities become +-cap: finite loss, zero slope.
  const CrossEntropyMath capped{
      .vocab = 4, .dtype = DType::kF32, .loss = {.reduction = Reduction::kNone, .softcap = 5}};
  const auto c = CrossEntropyReference(capped, 1, {0.5, kInf, 1.0, -kInf}, {0}, nullptr, true);
  EXPECT_TRUE(std::isfinite(c.loss[0]));
  EXPECT_EQ(c.grad[1], 0);
  EXPECT_EQ(c.grad[3], 0);
}

// A row with masked (-Inf) classes has a finite loss; its tolerance must be finite too. (An H200
// run found the loss tolerance NaN there when label smoothing was off: 0 * Inf.)
TEST(CrossEntropyReferenceTest, MaskedClassesKeepAFiniteLossTolerance) {
  const CrossEntropyMath m{
      .vocab = 4, .dtype = DType::kBF16, .loss = {.reduction = Reduction::kNone}};
  const std::vector<double> x = {-kInf, 1.0, 2.0, -kInf, 0.5, 1.5, -1.0, 3.0};
  const auto ref = CrossEntropyReference(m, 2, x, {1, 3}, nullptr, true);
  ASSERT_TRUE(std::isfinite(ref.loss[0]));
  for (const auto& [name, r] : CheckCrossEntropy(m, {.loss = &ref.loss, .grad = &ref.grad}, ref)) {
    EXPECT_TRUE(r.ok) << r.Describe(name);
  }
  std::vector<double> loss = ref.loss;
  loss[0] *= 1 + 1e-3;  // far past fp32 arithmetic error
  EXPECT_FALSE(CheckCrossEntropy(m, {.loss = &loss}, ref)[0].second.ok);
}

// The check accepts the reference (and its rounding to the dtype) and rejects an all-zero gradient
// and outputs pushed just past their tolerance.
TEST(CrossEntropyReferenceTest, ChecksRejectZeroAndPerturbedOutputs) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (double scale : {1.0, 30.0}) {
      SCOPED_TRACE(std::string(Name(t)) + " scale " + std::to_string(scale));
      const int64_t V = 1000, R = 16;
      const CrossEntropyMath m{
          .vocab = V,
          .dtype = t,
          .loss = {.reduction = Reduction::kMean, .label_smoothing = 0.1, .z_loss = 1e-4}};
      const std::vector<double> x = RandomLogits(R * V, scale, 7, t);
      std::vector<int64_t> targets(R);
      for (int64_t i = 0; i < R; ++i) targets[i] = (i * 389) % V;
      targets[3] = -100;
      const auto ref = CrossEntropyReference(m, R, x, targets, nullptr, true);
      const std::vector<double> rounded = Decode(Encode(ref.grad, t), t);
      for (const auto& [name, r] : CheckCrossEntropy(m,
                                                     {.loss = &ref.loss,
                                                     .lse = &ref.lse,
                                                     .argmax = &ref.argmax,
                                                     .counters = &ref.counters,
                                                     .grad = &rounded},
                                                     ref)) {
        EXPECT_TRUE(r.ok) << r.Describe(name);
      }
      const std::vector<double> zeros(ref.grad.size(), 0.0);
      EXPECT_FALSE(CheckCrossEntropy(m, {.grad = &zeros}, ref)[0].second.ok)
          << "an all-zero gradient passes";

      // One gradient element 1.5x its tolerance away, at a non-target entry and a target entry.
      const auto tol = CrossEntropyTolerancesFor(t);
      const std::vector<double> atol = CrossEntropyGradAtol(m, ref, tol);
      for (int64_t k : {int64_t{5}, targets[0]}) {
        std::vector<double> g = rounded;
        g[k] =
            ref.grad[k] + 1.5 * (atol[k] + tol.grad.atol + tol.grad.rtol * std::fabs(ref.grad[k]));
        EXPECT_FALSE(CheckCrossEntropy(m, {.grad = &g}, ref)[0].second.ok) << "element " << k;
      }
      std::vector<double> loss = ref.loss;
      loss[0] *= 1 + 1e-4;
      EXPECT_FALSE(CheckCrossEntropy(m, {.loss = &loss}, ref)[0].second.ok);
      std::vector<double> lse = ref.lse;
      lse[2] += 1e-4;
      EXPECT_FALSE(CheckCrossEntropy(m, {.lse = &lse}, ref)[0].second.ok);
      std::vector<double> argmax = ref.argmax;
      argmax[1] += 1;
      EXPECT_FALSE(CheckCrossEntropy(m, {.argmax = &argmax}, ref)[0].second.ok);
      const std::vector<double> counters = {ref.counters[0], ref.counters[1] + 1};
      EXPECT_FALSE(CheckCrossEntropy(m, {.counters = &counters}, ref)[0].second.ok);
      // An ignored row's loss must be exactly zero.
      CrossEntropyMath none = m;
      none.loss.reduction = Reduction::kNone;
      const auto ref_none = CrossEntropyReference(none, R, x, targets, nullptr, false);
      std::vector<double> rows = ref_none.loss;
      rows[3] = 1e-30;
      EXPECT_FALSE(CheckCrossEntropy(none, {.loss = &rows}, ref_none)[0].second.ok);
    }
  }
}

}  // namespace
}  // namespace kjit::ops
