// The RL heads (kjit/log_probs.h) on the GPU against the fp64 reference
// (ops/log_probs/tuning/reference.h): log-prob, entropy and lse of every row, and every gradient
// entry for the log-prob's upstream gradient alone, the entropy's alone and both, at temperatures
// 0.3, 1 and 1.7, over odd and large vocabs, one row, all rows ignored, three dtypes, in place and
// into another buffer, with a row stride and a misaligned start. Outputs are poisoned with NaN
// before each launch; a second launch must give the same bits. Skipped (visibly) without a GPU.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kjit/device_buffer.h"
#include "kjit/host_convert.h"
#include "ops/log_probs/tuning/reference.h"
#include "tests/gpu/gpu_test_env.h"

namespace kjit {
namespace {

using testing::Download;
using testing::IndexBytes;
using testing::Upload;

enum class Grads { kLogprob, kEntropy, kBoth };

struct Case {
  int64_t vocab = 1000;
  int64_t rows = 16;
  DType dtype = DType::kBF16;
  IndexType target_type = IndexType::kInt64;
  float temperature = 1.0f;
  bool entropy = true;
  Grads grads = Grads::kBoth;
  bool in_place = false;
  bool all_ignored = false;
  int64_t pad = 0;   // row_stride = vocab + pad
  int misalign = 0;  // logits start this many elements past an aligned address
  std::string Describe() const {
    return fmt::format(
        "vocab={} rows={} dtype={} T={} entropy={} grads={} in_place={} "
        "all_ignored={} pad={} misalign={}",
        vocab, rows, Name(dtype), temperature, entropy, static_cast<int>(grads), in_place,
        all_ignored, pad, misalign);
  }
};

// Tolerances: fp32 statistics over the row, the logits exact in their dtype; the gradient is
// rounded once to the dtype.
double GradTolerance(DType t) { return t == DType::kF32 ? 2e-5 : t == DType::kF16 ? 2e-3 : 1e-2; }

void RunCase(const Runtime& rt, const Case& c) {
  SCOPED_TRACE(c.Describe());
  const int64_t stride = c.vocab + c.pad;
  const size_t elem = SizeOf(c.dtype);
  std::mt19937 gen(static_cast<unsigned>(c.vocab * 31 + c.rows));
  std::normal_distribution<double> n(0.0, 3.0);
  std::vector<double> logits(c.rows * c.vocab);
  for (double& z : logits) z = RoundTo(n(gen), c.dtype);
  std::vector<int64_t> targets(c.rows);
  for (int64_t i = 0; i < c.rows; ++i) {
    targets[i] = c.all_ignored || i % 7 == 3 ? -100 : static_cast<int64_t>(gen() % c.vocab);
  }
  if (!c.all_ignored && c.rows > 1) targets[c.rows - 1] = c.vocab - 1;
  std::vector<double> g_lp(c.rows), g_h(c.rows);
  for (int64_t i = 0; i < c.rows; ++i) {
    g_lp[i] = RoundTo(n(gen) / 3, DType::kF32);
    g_h[i] = RoundTo(n(gen) / 3, DType::kF32);
  }
  const bool want_lp = c.grads != Grads::kEntropy, want_h = c.grads != Grads::kLogprob;
  const LogProbsSpec spec{.vocab = c.vocab,
                          .dtype = c.dtype,
                          .target_type = c.target_type,
                          .temperature = c.temperature,
                          .entropy = c.entropy || want_h};
  const ops::LogProbsResult ref = ops::LogProbsReference(
      spec, c.rows, logits, targets, want_lp ? &g_lp : nullptr, want_h ? &g_h : nullptr);

  // The logits, padded and shifted in their buffer.
  std::vector<double> image(c.misalign + c.rows * stride, 0.0);
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.vocab; ++j)
      image[c.misalign + i * stride + j] = logits[i * c.vocab + j];
  }
  ASSERT_OK_AND_ASSIGN(DeviceBuffer x, Upload(rt, Encode(image, c.dtype)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer t, Upload(rt, IndexBytes(targets, c.target_type)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer lp_out, Upload(rt, {}, c.rows * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer h_out, Upload(rt, {}, c.rows * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer lse_out, Upload(rt, {}, c.rows * 4));
  ASSERT_OK_AND_ASSIGN(LogProbs op, rt.LogProbs(spec));
  auto view = [&](const DeviceBuffer& b) {
    TensorView v = TensorView::Matrix(static_cast<char*>(b.data()) + c.misalign * elem, c.dtype,
                                      c.rows, c.vocab);
    v.row_stride = stride;
    return v;
  };
  const TensorView logits_view = view(x);
  const IndexView targets_view = IndexView::Of(t.data(), c.target_type, c.rows);
  auto vec = [&](const DeviceBuffer& b) {
    return TensorView::Vector(b.data(), DType::kF32, c.rows);
  };
  ASSERT_OK(op.Forward(nullptr, {.logits = logits_view,
                                 .targets = targets_view,
                                 .logprob = vec(lp_out),
                                 .entropy = spec.entropy ? vec(h_out) : TensorView{},
                                 .lse = vec(lse_out)}));
  auto floats = [&](const DeviceBuffer& b) -> std::vector<double> {
    auto bytes = Download(b, c.rows * 4);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? Decode(*bytes, DType::kF32) : std::vector<double>{};
  };
  const std::vector<double> lp = floats(lp_out), h = floats(h_out), lse = floats(lse_out);
  for (int64_t i = 0; i < c.rows; ++i) {
    EXPECT_NEAR(lp[i], ref.logprob[i], 2e-5 * (1 + std::fabs(ref.logprob[i]))) << "row " << i;
    if (spec.entropy) EXPECT_NEAR(h[i], ref.entropy[i], 2e-5 * (1 + ref.entropy[i])) << "row " << i;
    if (targets[i] != -100) EXPECT_NEAR(lse[i], ref.lse[i], 2e-5 * (1 + std::fabs(ref.lse[i])));
  }

  // Backward from the saved statistics, into another buffer or over the logits.
  ASSERT_OK_AND_ASSIGN(DeviceBuffer g_lp_buf, Upload(rt, Encode(g_lp, DType::kF32)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer g_h_buf, Upload(rt, Encode(g_h, DType::kF32)));
  std::optional<DeviceBuffer> separate;
  if (!c.in_place) {
    ASSERT_OK_AND_ASSIGN(DeviceBuffer s, Upload(rt, {}, image.size() * elem));
    separate.emplace(std::move(s));
  }
  const TensorView grad_view = c.in_place ? logits_view : view(*separate);
  ASSERT_OK(op.Backward(nullptr, {.logits = logits_view,
                                  .targets = targets_view,
                                  .lse = vec(lse_out),
                                  .entropy = want_h ? vec(h_out) : TensorView{},
                                  .grad_logprob = want_lp ? vec(g_lp_buf) : TensorView{},
                                  .grad_entropy = want_h ? vec(g_h_buf) : TensorView{},
                                  .grad = grad_view}));
  ASSERT_OK_AND_ASSIGN(std::vector<unsigned char> gbytes,
                       Download(c.in_place ? x : *separate, image.size() * elem));
  const std::vector<double> grad = Decode(gbytes, c.dtype);
  const double tol = GradTolerance(c.dtype);
  int bad = 0;
  for (int64_t i = 0; i < c.rows && bad < 10; ++i) {
    for (int64_t j = 0; j < c.vocab && bad < 10; ++j) {
      const double got = grad[c.misalign + i * stride + j], want = ref.grad[i * c.vocab + j];
      if (!(std::fabs(got - want) <= tol * (1e-3 + std::fabs(want)) + 1e-6)) {
        ADD_FAILURE() << "grad[" << i << "][" << j << "] = " << got << ", expected " << want;
        ++bad;
      }
    }
  }
}

TEST(LogProbsGpu, TemperaturesAndUpstreamGradients) {
  KJIT_REQUIRE_GPU(rt);
  for (float temperature : {0.3f, 1.0f, 1.7f}) {
    for (Grads g : {Grads::kLogprob, Grads::kEntropy, Grads::kBoth}) {
      RunCase(rt, {.vocab = 1001, .rows = 24, .temperature = temperature, .grads = g});
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(LogProbsGpu, ShapesDtypesAndViews) {
  KJIT_REQUIRE_GPU(rt);
  const std::vector<Case> cases = {
      {.vocab = 2, .rows = 5},
      {.vocab = 3, .rows = 1, .temperature = 0.3f},
      {.vocab = 50257, .rows = 9, .dtype = DType::kF16, .temperature = 1.7f},
      {.vocab = 151936, .rows = 4, .temperature = 0.7f, .in_place = true},
      {.vocab = 32001, .rows = 6, .dtype = DType::kF32, .target_type = IndexType::kInt32},
      {.vocab = 4099, .rows = 7, .entropy = false, .grads = Grads::kLogprob},
      {.vocab = 1000, .rows = 8, .all_ignored = true},
      {.vocab = 8192, .rows = 5, .in_place = true, .pad = 24, .misalign = 3},
  };
  for (const Case& c : cases) {
    RunCase(rt, c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace kjit
