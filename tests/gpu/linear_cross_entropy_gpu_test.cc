// The fused linear + cross-entropy on the GPU: loss, lse, argmax, d_hidden, d_weight and d_bias
// against the fp64 reference (ops/linear_cross_entropy/tuning/reference.h) on small and odd shapes
// with every option, chunk boundaries inside the batch, one and two streams, both weight-gradient
// accumulations, accumulation into existing gradients; bit-for-bit repeatability; a graph capture;
// and the whole LLaMA 3 lm_head shape against the unfused path (cuBLASLt logits, kjit's
// cross-entropy, cuBLASLt gradients).
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/driver.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/compare.h"
#include "ops/common/tuning/random_values.h"
#include "ops/common/tuning/trial.h"
#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/tuning/reference.h"
#include "ops/linear_cross_entropy/tuning/unfused.h"
#include "runtime/runtime_state.h"
#include "tests/gpu/gpu_test_env.h"

namespace kjit {
namespace {

using testing::Download;
using testing::IndexBytes;
using testing::IndexValues;
using testing::Upload;

enum class Targets { kMixed, kAllIgnored };

struct Case {
  int64_t rows = 64, vocab = 1000, hidden = 64;
  DType dtype = DType::kBF16;
  std::optional<DType> weight_grad_dtype;
  bool bias = false;
  Reduction reduction = Reduction::kMean;
  float smoothing = 0, z_loss = 0, softcap = 0;
  bool argmax = false;
  bool entropy = false;        // spec.entropy and the entropy output
  bool logprob = false;        // the target_logprob output
  bool class_weights = false;  // fp32 per-class weights in [0, 2), every 7th class 0
  IndexType target_type = IndexType::kInt64;
  WeightGradAccumulation accumulation = WeightGradAccumulation::kFloat32;
  bool accumulate = false;   // add to existing d_weight, d_bias
  bool grad_output = false;  // an upstream gradient other than 1
  bool forward_only = false;
  Targets targets = Targets::kMixed;
  int64_t chunk_rows = 24;
  int64_t whole_rows = 0;
  int streams = 1;

  LinearCrossEntropySpec Spec() const {
    return {.vocab = vocab,
            .hidden = hidden,
            .dtype = dtype,
            .weight_grad_dtype = weight_grad_dtype,
            .bias = bias,
            .loss = {.target_type = target_type,
                     .reduction = reduction,
                     .label_smoothing = smoothing,
                     .z_loss = z_loss,
                     .softcap = softcap,
                     .argmax = argmax,
                     .entropy = entropy,
                     .class_weight_dtype =
                         class_weights ? std::optional<DType>(DType::kF32) : std::nullopt},
            .weight_grad_accumulation = accumulation,
            .config = LinearCrossEntropyConfig{
                .chunk_rows = chunk_rows, .whole_rows = whole_rows, .streams = streams}};
  }
  std::string Describe() const {
    return fmt::format(
        "rows={} vocab={} hidden={} {} d_weight={} bias={} {} eps={} z={} cap={} argmax={} "
        "targets={} acc={} accumulate={} grad_output={} forward_only={} ignored={} chunk={} "
        "whole={} streams={} entropy={} logprob={} class_weights={}",
        rows, vocab, hidden, Name(dtype), Name(Spec().weight_grad()), bias, Name(reduction),
        smoothing, z_loss, softcap, argmax, Name(target_type), Name(accumulation), accumulate,
        grad_output, forward_only, targets == Targets::kAllIgnored, chunk_rows, whole_rows, streams,
        entropy, logprob, class_weights);
  }
};

struct Written {
  std::vector<unsigned char> loss, lse, argmax, d_hidden, d_weight, d_bias, entropy, logprob;
  bool operator==(const Written&) const = default;
};

void RunCase(const Runtime& rt, const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.Describe());
  const LinearCrossEntropySpec spec = c.Spec();
  ASSERT_OK_AND_ASSIGN(LinearCrossEntropy op, rt.LinearCrossEntropy(spec));
  const int64_t R = c.rows, V = c.vocab, H = c.hidden;
  const DType wg = spec.weight_grad();
  const bool none = c.reduction == Reduction::kNone;

  std::mt19937_64 gen(seed);
  ops::LinearCrossEntropyProblem p{.rows = R, .vocab = V, .hidden = H};
  // Logits of deviation about 3: softmaxes from flat to peaked.
  p.hidden_states = ops::RandomValues(gen, R * H, 1.0, 0.0, c.dtype);
  p.weight = ops::RandomValues(gen, V * H, 3.0 / std::sqrt(static_cast<double>(H)), 0.0, c.dtype);
  if (c.bias) p.bias = ops::RandomValues(gen, V, 0.5, 0.0, c.dtype);
  std::uniform_int_distribution<int64_t> token(0, V - 1);
  p.targets.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    p.targets[r] = c.targets == Targets::kAllIgnored || r % 7 == 5 ? -100 : token(gen);
  }
  if (c.targets == Targets::kMixed) {
    p.targets[0] = 0;
    if (R > 2) p.targets[R - 1] = V - 1;
    if (R > 3) p.targets[R - 2] = V;  // out of range: counted, ignored
  }
  if (c.grad_output) p.grad_output = ops::RandomValues(gen, none ? R : 1, 1.0, 0.5, DType::kF32);
  if (c.class_weights) {
    std::uniform_real_distribution<double> u(0.0, 2.0);
    p.class_weight.resize(V);
    for (int64_t v = 0; v < V; ++v)
      p.class_weight[v] = v % 7 == 3 ? 0.0 : RoundTo(u(gen), DType::kF32);
  }
  if (c.accumulate) {
    p.d_weight_before = ops::RandomValues(gen, V * H, 0.01, 0.0, wg);
    if (c.bias) p.d_bias_before = ops::RandomValues(gen, V, 0.01, 0.0, wg);
  }
  const int64_t chunk = R <= c.whole_rows ? R : std::min(c.chunk_rows, R);
  const int64_t chunks = (R + chunk - 1) / chunk;
  const ops::LinearCrossEntropyResult ref = ops::LinearCrossEntropyReference(spec, p, chunks);

  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_h, Upload(rt, Encode(p.hidden_states, c.dtype)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_w, Upload(rt, Encode(p.weight, c.dtype)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_b, Upload(rt, Encode(p.bias, c.dtype)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_t, Upload(rt, IndexBytes(p.targets, c.target_type)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_go, Upload(rt, Encode(p.grad_output, DType::kF32)));
  const int64_t loss_n = none ? R : 1;
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, Upload(rt, {}, loss_n * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_lse, Upload(rt, {}, R * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_am, Upload(rt, {}, R * SizeOf(c.target_type)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ent, Upload(rt, {}, R * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_lp, Upload(rt, {}, R * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_cw, Upload(rt, Encode(p.class_weight, DType::kF32), V * 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_dh, Upload(rt, {}, R * H * SizeOf(c.dtype)));
  const std::vector<unsigned char> dw_before = Encode(p.d_weight_before, wg);
  const std::vector<unsigned char> db_before = Encode(p.d_bias_before, wg);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_dw, Upload(rt, dw_before, V * H * SizeOf(wg)));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_db, Upload(rt, db_before, V * SizeOf(wg)));
  const int64_t ws_bytes = op.WorkspaceBytes(R);
  ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, Upload(rt, {}, ws_bytes));

  LinearCrossEntropyArgs args{
      .hidden_states = TensorView::Matrix(d_h.data(), c.dtype, R, H),
      .weight = TensorView::Matrix(d_w.data(), c.dtype, V, H),
      .bias = c.bias ? TensorView::Vector(d_b.data(), c.dtype, V) : TensorView{},
      .targets = IndexView::Of(d_t.data(), c.target_type, R),
      .loss = TensorView::Vector(d_loss.data(), DType::kF32, loss_n),
      .lse = TensorView::Vector(d_lse.data(), DType::kF32, R),
      .argmax = c.argmax ? IndexView::Of(d_am.data(), c.target_type, R) : IndexView{},
      .class_weight =
          c.class_weights ? TensorView::Vector(d_cw.data(), DType::kF32, V) : TensorView{},
      .workspace = d_ws.data(),
      .workspace_bytes = ws_bytes};
  if (c.entropy) args.entropy = TensorView::Vector(d_ent.data(), DType::kF32, R);
  if (c.logprob) args.target_logprob = TensorView::Vector(d_lp.data(), DType::kF32, R);
  if (!c.forward_only) {
    if (c.grad_output) args.grad_output = TensorView::Vector(d_go.data(), DType::kF32, loss_n);
    args.d_hidden = TensorView::Matrix(d_dh.data(), c.dtype, R, H);
    args.d_weight = TensorView::Matrix(d_dw.data(), wg, V, H);
    if (c.bias) args.d_bias = TensorView::Vector(d_db.data(), wg, V);
    args.accumulate = c.accumulate;
  }
  auto launch = [&](Written* out) {
    ASSERT_OK(d_ent.Fill(0xFF));  // poisoned: every row must be written
    ASSERT_OK(d_lp.Fill(0xFF));
    ASSERT_OK(c.forward_only ? op.Forward(nullptr, args) : op.ForwardBackward(nullptr, args));
    ASSERT_OK_AND_ASSIGN(out->loss, Download(d_loss, loss_n * 4));
    ASSERT_OK_AND_ASSIGN(out->lse, Download(d_lse, R * 4));
    if (c.argmax) {
      ASSERT_OK_AND_ASSIGN(out->argmax, Download(d_am, R * SizeOf(c.target_type)));
    }
    if (c.entropy) {
      ASSERT_OK_AND_ASSIGN(out->entropy, Download(d_ent, R * 4));
    }
    if (c.logprob) {
      ASSERT_OK_AND_ASSIGN(out->logprob, Download(d_lp, R * 4));
    }
    if (c.forward_only) return;
    ASSERT_OK_AND_ASSIGN(out->d_hidden, Download(d_dh, R * H * SizeOf(c.dtype)));
    ASSERT_OK_AND_ASSIGN(out->d_weight, Download(d_dw, V * H * SizeOf(wg)));
    if (c.bias) {
      ASSERT_OK_AND_ASSIGN(out->d_bias, Download(d_db, V * SizeOf(wg)));
    }
  };
  Written first;
  launch(&first);
  if (::testing::Test::HasFatalFailure()) return;

  const std::vector<double> loss = Decode(first.loss, DType::kF32),
                            lse = Decode(first.lse, DType::kF32);
  const std::vector<double> d_hidden = Decode(first.d_hidden, c.dtype);
  const std::vector<double> d_weight = Decode(first.d_weight, wg),
                            d_bias = Decode(first.d_bias, wg);
  const std::vector<double> entropy = Decode(first.entropy, DType::kF32),
                            logprob = Decode(first.logprob, DType::kF32),
                            argmax_values = IndexValues(first.argmax, c.target_type);
  ops::LinearCrossEntropyOutputs outs{.loss = &loss, .lse = &lse};
  if (c.entropy) outs.entropy = &entropy;
  if (c.logprob) outs.target_logprob = &logprob;
  if (c.argmax) outs.argmax = &argmax_values;
  if (c.entropy) {
    // The entropy check can fail: one row off by twice its bound.
    std::vector<double> off = entropy;
    off[0] = ref.loss.entropy[0] + 2 * ref.entropy_atol[0] + 1e-6;
    EXPECT_FALSE(ops::CheckLinearCrossEntropy({.entropy = &off}, ref)[0].second.ok);
  }
  if (!c.forward_only) {
    outs.d_hidden = &d_hidden;
    outs.d_weight = &d_weight;
    if (c.bias) outs.d_bias = &d_bias;
  }
  for (const auto& [name, r] : ops::CheckLinearCrossEntropy(outs, ref)) {
    EXPECT_TRUE(r.ok) << r.Describe(name);
    EXPECT_GT(r.checked, 0) << name;
  }
  if (c.argmax) {
    // The device's argmax is over its rounded logits: its exact logit is within twice the row's
    // logit error of the largest.
    const std::vector<double> am = IndexValues(first.argmax, c.target_type);
    for (int64_t r = 0; r < R; ++r) {
      ASSERT_TRUE(am[r] >= 0 && am[r] < V) << "row " << r << ": argmax " << am[r];
      double best = -INFINITY;
      for (int64_t v = 0; v < V; ++v) best = std::max(best, ref.logits[r * V + v]);
      EXPECT_GE(ref.logits[r * V + static_cast<int64_t>(am[r])], best - 2 * ref.logit_error[r])
          << "row " << r;
    }
  }
  if (!c.forward_only && !c.accumulate) {
    // The check can fail: a d_weight off by 3% at its largest entry is rejected; with a bias, whose
    // bound lets every logit take cuBLASLt's epilogue's second rounding, 25%.
    const double factor = c.bias ? 1.25 : 1.03;
    std::vector<double> off = d_weight;
    size_t at = 0;
    for (size_t i = 0; i < off.size(); ++i) {
      if (std::fabs(ref.d_weight[i]) > std::fabs(ref.d_weight[at])) at = i;
    }
    off[at] = ref.d_weight[at] * factor;
    if (ref.d_weight[at] != 0) {
      EXPECT_FALSE(ops::Compare(off, ref.d_weight, {}, ref.d_weight_atol).ok)
          << "an error of " << factor - 1 << " at the largest entry passed";
    }
  }

  // Same inputs, same bits (accumulating runs start again from the same gradients).
  if (c.accumulate) {
    ASSERT_OK(d_dw.Upload(dw_before.data(), dw_before.size()));
    if (c.bias) ASSERT_OK(d_db.Upload(db_before.data(), db_before.size()));
  }
  ASSERT_OK(d_ws.Fill(0xFF));
  Written second;
  launch(&second);
  EXPECT_TRUE(first == second) << "two launches differ";
}

void RunAll(const std::vector<Case>& cases) {
  KJIT_REQUIRE_GPU(rt);
  uint64_t seed = 1;
  for (const Case& c : cases) {
    RunCase(rt, c, seed++);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(LinearCrossEntropyGpu, DtypesReductionsAndStreams) {
  std::vector<Case> cases;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      for (int streams : {1, 2}) {
        cases.push_back(
            {.dtype = t, .reduction = r, .grad_output = r != Reduction::kMean, .streams = streams});
      }
    }
  }
  RunAll(cases);
}

// The loss options of bits 0-3 of `options` on a small odd shape: bias, label smoothing, z-loss,
// soft-cap; index type and streams rotate with it.
Case WithLossOptions(int options) {
  Case c{.rows = 50, .vocab = 515, .hidden = 40};
  c.bias = options & 1;
  c.smoothing = options & 2 ? 0.1f : 0;
  c.z_loss = options & 4 ? 1e-3f : 0;
  c.softcap = options & 8 ? 15.0f : 0;
  c.target_type = options % 3 == 0 ? IndexType::kInt32 : IndexType::kInt64;
  c.streams = 1 + options % 2;
  return c;
}

TEST(LinearCrossEntropyGpu, EveryOption) {
  std::vector<Case> cases;
  for (int options = 0; options < 32; ++options) {
    Case c = WithLossOptions(options);
    c.argmax = options & 16;
    cases.push_back(c);
  }
  RunAll(cases);
}

// The per-row extras (issue 35) and class weights, with every loss option, chunked and whole,
// every dtype and reduction, odd shapes (vocabs that are no multiple of 8, one row, all rows
// ignored), and reduction none with per-row upstream gradients.
TEST(LinearCrossEntropyGpu, EntropyLogprobAndClassWeights) {
  std::vector<Case> cases;
  for (int options = 0; options < 32; ++options) {
    Case c = WithLossOptions(options);
    c.class_weights = options & 16;
    c.entropy = options % 4 != 3;
    c.logprob = options % 3 != 2;
    c.argmax = options % 2 == 0;
    c.reduction = static_cast<Reduction>(options % 3);
    c.grad_output = options % 2 == 1;
    c.forward_only = options % 5 == 4;
    c.dtype = options % 7 == 6 ? DType::kF32 : options % 7 == 5 ? DType::kF16 : DType::kBF16;
    c.whole_rows = options % 4 == 1 ? 64 : 0;
    cases.push_back(c);
  }
  Case odd{.rows = 1, .vocab = 3, .hidden = 5};
  odd.entropy = odd.logprob = odd.class_weights = true;
  cases.push_back(odd);
  odd.rows = 33;
  odd.vocab = 1001;
  odd.hidden = 24;
  odd.targets = Targets::kAllIgnored;
  cases.push_back(odd);  // mean over no rows, with class weights: NaN
  odd.class_weights = false;
  odd.reduction = Reduction::kNone;
  odd.argmax = odd.grad_output = true;
  cases.push_back(odd);
  RunAll(cases);
}

TEST(LinearCrossEntropyGpu, OddShapesOneRowAndAllIgnored) {
  RunAll({{.rows = 67, .vocab = 50257, .hidden = 96, .chunk_rows = 32, .streams = 2},
          {.rows = 33, .vocab = 1003, .hidden = 4095, .bias = true, .chunk_rows = 16},
          {.rows = 1, .vocab = 50257, .hidden = 64, .bias = true},
          {.rows = 1, .vocab = 2, .hidden = 1, .reduction = Reduction::kSum},
          {.rows = 40, .vocab = 700, .hidden = 48, .bias = true, .targets = Targets::kAllIgnored},
          {.rows = 40,
           .vocab = 700,
           .hidden = 48,
           .reduction = Reduction::kSum,
           .targets = Targets::kAllIgnored,
           .streams = 2},
          {.rows = 48, .vocab = 640, .hidden = 64, .chunk_rows = 48},  // one chunk exactly
          {.rows = 48, .vocab = 640, .hidden = 64, .chunk_rows = 1, .streams = 2}});
}

TEST(LinearCrossEntropyGpu, WeightGradientAccumulation) {
  std::vector<Case> cases;
  for (bool accumulate : {false, true}) {
    for (auto acc : {WeightGradAccumulation::kFloat32, WeightGradAccumulation::kOutputDtype}) {
      for (std::optional<DType> wg : {std::optional<DType>{}, std::optional<DType>{DType::kF32}}) {
        cases.push_back({.rows = 70,
                         .vocab = 900,
                         .hidden = 72,
                         .weight_grad_dtype = wg,
                         .bias = true,
                         .accumulation = acc,
                         .accumulate = accumulate,
                         .chunk_rows = 16,
                         .streams = accumulate ? 2 : 1});
      }
    }
    // The rows as one chunk through whole_rows (the heuristic's way at LLaMA's 8192 rows), and
    // one row past it: chunks again.
    for (int64_t rows : {70, 71}) {
      cases.push_back({.rows = rows,
                       .vocab = 900,
                       .hidden = 72,
                       .bias = true,
                       .accumulate = accumulate,
                       .chunk_rows = 16,
                       .whole_rows = 70,
                       .streams = 2});
    }
  }
  RunAll(cases);
}

// RescaleGradients: where grad_output equals applied every bit stays; otherwise each element
// becomes round(x * fp32(g / a)), checked bit for bit against the same arithmetic on the host, on
// 4-wide (contiguous, even width) and scalar (odd width) gradients, in the dtype and in fp32.
TEST(LinearCrossEntropyGpu, RescaleGradientsFollowTheFormulaBitForBit) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t R = 37, V = 1000;
  std::mt19937_64 gen(7);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t H : {64, 4095}) {
      SCOPED_TRACE(fmt::format("{} hidden={}", Name(dt), H));
      ASSERT_OK_AND_ASSIGN(LinearCrossEntropy op,
                           rt.LinearCrossEntropy({.vocab = V,
                                                  .hidden = H,
                                                  .dtype = dt,
                                                  .weight_grad_dtype = DType::kF32,
                                                  .bias = true}));
      struct Gradient {
        DType dtype;
        int64_t rows, cols;
        std::vector<unsigned char> bytes;
        std::optional<DeviceBuffer> buffer;
        TensorView View() const { return TensorView::Matrix(buffer->data(), dtype, rows, cols); }
      };
      Gradient grads[] = {{dt, R, H}, {DType::kF32, V, H}, {DType::kF32, 1, V}};
      for (Gradient& g : grads) {
        g.bytes = Encode(ops::RandomValues(gen, g.rows * g.cols, 1e-3, 0.0, g.dtype), g.dtype);
        ASSERT_OK_AND_ASSIGN(DeviceBuffer b, Upload(rt, g.bytes));
        g.buffer.emplace(std::move(b));
      }
      for (auto [g, a] : {std::pair<float, float>{0.5f, 0.5f},
                          {1.0f, NAN},
                          {3.0f, 0.7f},
                          {0.125f, NAN},
                          {-2.0f, 1.0f}}) {
        SCOPED_TRACE(fmt::format("grad_output={} applied={}", g, a));
        ASSERT_OK_AND_ASSIGN(DeviceBuffer d_g, Upload(rt, Encode({g}, DType::kF32)));
        ASSERT_OK_AND_ASSIGN(DeviceBuffer d_a, Upload(rt, Encode({a}, DType::kF32)));
        const bool has_applied = !std::isnan(a);
        ASSERT_OK(op.RescaleGradients(
            nullptr, {.d_hidden = grads[0].View(),
                      .d_weight = grads[1].View(),
                      .d_bias = grads[2].View(),
                      .grad_output = TensorView::Vector(d_g.data(), DType::kF32, 1),
                      .applied = has_applied ? TensorView::Vector(d_a.data(), DType::kF32, 1)
                                             : TensorView{}}));
        const float applied = has_applied ? a : 1.0f;
        const float factor = g / applied;  // one IEEE division, as the kernel's __fdiv_rn
        for (Gradient& grad : grads) {
          const size_t n = grad.bytes.size();
          ASSERT_OK_AND_ASSIGN(std::vector<unsigned char> got, Download(*grad.buffer, n));
          if (g != applied) {
            std::vector<double> x = Decode(grad.bytes, grad.dtype);
            for (double& v : x) v = static_cast<float>(v) * factor;  // one fp32 multiply
            grad.bytes = Encode(x, grad.dtype);                      // rounded to the dtype once
          }
          EXPECT_TRUE(got == grad.bytes) << Name(grad.dtype) << " [" << grad.rows << " x "
                                         << grad.cols << "] differs from the formula";
          grad.bytes = got;
        }
      }
    }
  }
}

TEST(LinearCrossEntropyGpu, ForwardOnly) {
  RunAll({{.argmax = true, .forward_only = true},
          {.bias = true, .reduction = Reduction::kNone, .forward_only = true, .streams = 2}});
}

// Graph-safe: captured on a stream of the caller's (two streams: the op forks and joins), the
// replays give the bits of a direct launch.
TEST(LinearCrossEntropyGpu, CapturedInAGraphGivesTheBitsOfADirectLaunch) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t R = 300, V = 32000, H = 256;
  for (int streams : {1, 2}) {
    SCOPED_TRACE(fmt::format("streams={}", streams));
    ASSERT_OK_AND_ASSIGN(LinearCrossEntropy op,
                         rt.LinearCrossEntropy({.vocab = V,
                                                .hidden = H,
                                                .bias = true,
                                                .config = LinearCrossEntropyConfig{
                                                    .chunk_rows = 128, .streams = streams}}));
    const jit::Driver& cu = *internal::StateOf(rt).driver;
    std::mt19937_64 gen(11);
    ASSERT_OK_AND_ASSIGN(
        DeviceBuffer d_h,
        Upload(rt, Encode(ops::RandomValues(gen, R * H, 1, 0, DType::kBF16), DType::kBF16)));
    ASSERT_OK_AND_ASSIGN(
        DeviceBuffer d_w,
        Upload(rt, Encode(ops::RandomValues(gen, V * H, 0.2, 0, DType::kBF16), DType::kBF16)));
    ASSERT_OK_AND_ASSIGN(
        DeviceBuffer d_b,
        Upload(rt, Encode(ops::RandomValues(gen, V, 0.2, 0, DType::kBF16), DType::kBF16)));
    std::vector<int64_t> t(R);
    for (int64_t i = 0; i < R; ++i) t[i] = i % 5 == 4 ? -100 : (i * 7919) % V;
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_t, Upload(rt, IndexBytes(t, IndexType::kInt64)));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_loss, Upload(rt, {}, 4));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_dh, Upload(rt, {}, R * H * 2));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_dw, Upload(rt, {}, V * H * 2));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_db, Upload(rt, {}, V * 2));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer d_ws, Upload(rt, {}, op.WorkspaceBytes(R)));
    const LinearCrossEntropyArgs args{
        .hidden_states = TensorView::Matrix(d_h.data(), DType::kBF16, R, H),
        .weight = TensorView::Matrix(d_w.data(), DType::kBF16, V, H),
        .bias = TensorView::Vector(d_b.data(), DType::kBF16, V),
        .targets = IndexView::Of(d_t.data(), IndexType::kInt64, R),
        .loss = TensorView::Vector(d_loss.data(), DType::kF32, 1),
        .d_hidden = TensorView::Matrix(d_dh.data(), DType::kBF16, R, H),
        .d_weight = TensorView::Matrix(d_dw.data(), DType::kBF16, V, H),
        .d_bias = TensorView::Vector(d_db.data(), DType::kBF16, V),
        .workspace = d_ws.data(),
        .workspace_bytes = op.WorkspaceBytes(R)};
    CUstream stream = nullptr;
    ASSERT_EQ(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    auto outputs = [&](Written* out) {
      ASSERT_EQ(cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
      ASSERT_OK_AND_ASSIGN(out->loss, Download(d_loss, 4));
      ASSERT_OK_AND_ASSIGN(out->d_hidden, Download(d_dh, R * H * 2));
      ASSERT_OK_AND_ASSIGN(out->d_weight, Download(d_dw, V * H * 2));
      ASSERT_OK_AND_ASSIGN(out->d_bias, Download(d_db, V * 2));
      for (const DeviceBuffer* b : {&d_loss, &d_dh, &d_dw, &d_db, &d_ws}) ASSERT_OK(b->Fill(0xFF));
    };
    Written direct;
    ASSERT_OK(op.ForwardBackward(stream, args));
    outputs(&direct);
    float loss = 0;
    std::memcpy(&loss, direct.loss.data(), 4);
    EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;

    ASSERT_EQ(cu.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    const absl::Status captured = op.ForwardBackward(stream, args);
    CUgraph graph = nullptr;
    ASSERT_EQ(cu.cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
    ASSERT_OK(captured);
    CUgraphExec exec = nullptr;
    ASSERT_EQ(cu.cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_EQ(cu.cuGraphLaunch(exec, stream), CUDA_SUCCESS);
      Written replayed;
      outputs(&replayed);
      EXPECT_TRUE(replayed == direct) << "replay " << replay << " differs from the direct launch";
    }
    EXPECT_EQ(cu.cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT_EQ(cu.cuGraphDestroy(graph), CUDA_SUCCESS);
    EXPECT_EQ(cu.cuStreamDestroy(stream), CUDA_SUCCESS);
  }
}

// LLaMA 3's lm_head at 8192 tokens on the device: hidden states uniform in [-2, 2), the weight in
// +-w_range, int64 targets.
struct LlamaLmHead {
  static constexpr int64_t R = 8192, V = 128256, H = 4096;
  DeviceBuffer h, w, t;
  TensorView Hidden() const { return TensorView::Matrix(h.data(), DType::kBF16, R, H); }
  TensorView Weight() const { return TensorView::Matrix(w.data(), DType::kBF16, V, H); }
  IndexView Targets() const { return IndexView::Of(t.data(), IndexType::kInt64, R); }
};

absl::StatusOr<LlamaLmHead> MakeLlamaLmHead(const Runtime& rt, float w_range) {
  using L = LlamaLmHead;
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer h, DeviceBuffer::Create(rt, L::R * L::H * 2));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer w, DeviceBuffer::Create(rt, L::V * L::H * 2));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer t, DeviceBuffer::Create(rt, L::R * 8));
  KJIT_RETURN_IF_ERROR(ops::RandomFill(rt, h.data(), DType::kBF16, L::R, L::H, L::H, 1, -2, 2));
  KJIT_RETURN_IF_ERROR(
      ops::RandomFill(rt, w.data(), DType::kBF16, L::V, L::H, L::H, 2, -w_range, w_range));
  KJIT_RETURN_IF_ERROR(ops::RandomTargets(rt, t.data(), IndexType::kInt64, L::R, 3, L::V));
  return LlamaLmHead{std::move(h), std::move(w), std::move(t)};
}

// The heuristic's spec (which takes LLaMA's 8192 rows whole) and the same with its chunked
// schedule (whole_rows 0: 1920-row chunks summed in the fp32 accumulator).
std::vector<LinearCrossEntropySpec> WholeAndChunked() {
  const LinearCrossEntropySpec whole{.vocab = LlamaLmHead::V, .hidden = LlamaLmHead::H};
  LinearCrossEntropySpec chunked = whole;
  chunked.config = ops::DefaultLinearCrossEntropyConfig(whole);
  EXPECT_GE(chunked.config->whole_rows, LlamaLmHead::R) << "the heuristic takes 8192 rows whole";
  chunked.config->whole_rows = 0;
  return {whole, chunked};
}

// The workspace formula of kjit/linear_cross_entropy.h at LLaMA 3's shape, and no device memory
// taken beyond it by a launch (the driver's free memory around two launches, the second after
// cuBLASLt's plans exist).
TEST(LinearCrossEntropyGpu, TakesNoMemoryBeyondItsWorkspace) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t R = LlamaLmHead::R, V = LlamaLmHead::V, H = LlamaLmHead::H;
  const jit::Driver& cu = *internal::StateOf(rt).driver;
  const int64_t accumulator = V * H * 4, half_gib = int64_t{1} << 29;
  ASSERT_OK_AND_ASSIGN(const LlamaLmHead p, MakeLlamaLmHead(rt, 0.02f));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer loss, DeviceBuffer::Create(rt, 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer dh, DeviceBuffer::Create(rt, R * H * 2));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer dw, DeviceBuffer::Create(rt, V * H * 2));
  for (const LinearCrossEntropySpec& spec : WholeAndChunked()) {
    ASSERT_OK_AND_ASSIGN(LinearCrossEntropy op, rt.LinearCrossEntropy(spec));
    SCOPED_TRACE(op.ConfigFor(R).ToString());
    const int64_t ws_bytes = op.WorkspaceBytes(R);
    if (spec.config) {
      // 1920-row chunks: the fp32 accumulator and under 0.5 GiB besides.
      EXPECT_EQ(op.AccumulatorBytes(R), accumulator);
      EXPECT_LE(ws_bytes - accumulator, half_gib) << "over 0.5 GiB besides fp32";
    } else {
      // The heuristic: the rows' logits in the accumulator's place, no more than the chunks'
      // workspace, and the 8192 rows' logits plus cuBLASLt's and the loss's under 64 MiB besides.
      EXPECT_EQ(op.AccumulatorBytes(R), 0);
      EXPECT_LE(ws_bytes, accumulator + half_gib);
      EXPECT_LE(ws_bytes - R * V * 2, 64 << 20);
    }
    ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, DeviceBuffer::Create(rt, ws_bytes));
    const LinearCrossEntropyArgs args{.hidden_states = p.Hidden(),
                                      .weight = p.Weight(),
                                      .targets = p.Targets(),
                                      .loss = TensorView::Vector(loss.data(), DType::kF32, 1),
                                      .d_hidden = TensorView::Matrix(dh.data(), DType::kBF16, R, H),
                                      .d_weight = TensorView::Matrix(dw.data(), DType::kBF16, V, H),
                                      .workspace = ws.data(),
                                      .workspace_bytes = ws_bytes};
    for (int launch = 0; launch < 2; ++launch) {
      ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
      size_t free_before = 0, free_after = 0, total = 0;
      ASSERT_EQ(cu.cuMemGetInfo(&free_before, &total), CUDA_SUCCESS);
      ASSERT_OK(op.ForwardBackward(nullptr, args));
      ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
      ASSERT_EQ(cu.cuMemGetInfo(&free_after, &total), CUDA_SUCCESS);
      const int64_t grown = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
      fmt::print(
          "{}: launch {}: workspace {} MiB ({} MiB fp32 accumulator), device memory taken {} B\n",
          op.ConfigFor(R).ToString(), launch, ws_bytes >> 20, op.AccumulatorBytes(R) >> 20, grown);
      // The first launch may grow the driver's local-memory pool; the logits alone are 2 GiB.
      EXPECT_LE(grown, launch == 0 ? 32 << 20 : 0) << "launch " << launch;
    }
  }
}

// LLaMA 3's lm_head at 8192 tokens against the unfused path: the whole [8192, 128256] logits from
// cuBLASLt, kjit's cross-entropy over them (mean, gradient in place), cuBLASLt's d_hidden and an
// fp32 d_weight. Both of the op's schedules: the heuristic's (the rows as one chunk, in the
// accumulator's place) and 1920-row chunks summed in the fp32 accumulator. Same math, different
// GEMM shapes (so a logit may round differently): the loss within 1e-3 relative, each gradient
// within a few bf16 roundings of its entry plus 2^-8 of the tensor's RMS.
TEST(LinearCrossEntropyGpu, LlamaShapeMatchesTheUnfusedPath) {
  KJIT_REQUIRE_GPU(rt);
  const int64_t R = LlamaLmHead::R, V = LlamaLmHead::V, H = LlamaLmHead::H;
  const jit::Driver& cu = *internal::StateOf(rt).driver;
  ASSERT_OK_AND_ASSIGN(const LlamaLmHead p, MakeLlamaLmHead(rt, 0.05f));
  const TensorView h = p.Hidden(), w = p.Weight();
  const IndexView t = p.Targets();

  // Unfused.
  ASSERT_OK_AND_ASSIGN(DeviceBuffer u_loss, DeviceBuffer::Create(rt, 4));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer u_dh, DeviceBuffer::Create(rt, R * H * 2));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer u_dw, DeviceBuffer::Create(rt, V * H * 4));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ops::UnfusedLinearCrossEntropy> unfused,
                         ops::UnfusedLinearCrossEntropy::Create(
                             rt, {.vocab = V},
                             {.hidden = h,
                              .weight = w,
                              .targets = t,
                              .loss = TensorView::Vector(u_loss.data(), DType::kF32, 1),
                              .d_hidden = TensorView::Matrix(u_dh.data(), DType::kBF16, R, H),
                              .d_weight = TensorView::Matrix(u_dw.data(), DType::kF32, V, H)}));
    ASSERT_OK(unfused->Run(nullptr));
    ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
  }
  ASSERT_OK_AND_ASSIGN(std::vector<double> ul, DownloadValues(u_loss, DType::kF32));
  EXPECT_GT(ul[0], std::log(static_cast<double>(V)) * 0.5);
  ASSERT_OK_AND_ASSIGN(std::vector<double> udh, DownloadValues(u_dh, DType::kBF16));
  ASSERT_OK_AND_ASSIGN(std::vector<double> udw, DownloadValues(u_dw, DType::kF32));

  auto compare = [](const char* name, const std::vector<double>& got,
                    const std::vector<double>& want) {
    const ops::CompareResult r = ops::CompareGemmResult(got, want, DType::kBF16);
    EXPECT_TRUE(r.ok) << r.Describe(name);
    fmt::print("{}: worst |fused - unfused| / tolerance {:.3f}\n", name, r.worst_ratio);
    // The check can fail: a tensor 5% off everywhere is rejected.
    std::vector<double> off = got;
    for (double& x : off) x *= 1.05;
    EXPECT_FALSE(ops::CompareGemmResult(off, want, DType::kBF16).ok) << name;
  };
  for (const LinearCrossEntropySpec& spec : WholeAndChunked()) {
    ASSERT_OK_AND_ASSIGN(LinearCrossEntropy op, rt.LinearCrossEntropy(spec));
    SCOPED_TRACE(op.ConfigFor(R).ToString());
    ASSERT_OK_AND_ASSIGN(DeviceBuffer f_loss, DeviceBuffer::Create(rt, 4));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer f_dh, DeviceBuffer::Create(rt, R * H * 2));
    ASSERT_OK_AND_ASSIGN(DeviceBuffer f_dw, DeviceBuffer::Create(rt, V * H * 2));
    {
      ASSERT_OK_AND_ASSIGN(DeviceBuffer ws, DeviceBuffer::Create(rt, op.WorkspaceBytes(R)));
      ASSERT_OK(op.ForwardBackward(nullptr,
                                   {.hidden_states = h,
                                    .weight = w,
                                    .targets = t,
                                    .loss = TensorView::Vector(f_loss.data(), DType::kF32, 1),
                                    .d_hidden = TensorView::Matrix(f_dh.data(), DType::kBF16, R, H),
                                    .d_weight = TensorView::Matrix(f_dw.data(), DType::kBF16, V, H),
                                    .workspace = ws.data(),
                                    .workspace_bytes = op.WorkspaceBytes(R)}));
      ASSERT_EQ(cu.cuCtxSynchronize(), CUDA_SUCCESS);
    }
    ASSERT_OK_AND_ASSIGN(std::vector<double> fl, DownloadValues(f_loss, DType::kF32));
    EXPECT_NEAR(fl[0], ul[0], 1e-3 * std::fabs(ul[0])) << "fused " << fl[0] << " unfused " << ul[0];
    ASSERT_OK_AND_ASSIGN(std::vector<double> fdh, DownloadValues(f_dh, DType::kBF16));
    compare("d_hidden", fdh, udh);
    ASSERT_OK_AND_ASSIGN(std::vector<double> fdw, DownloadValues(f_dw, DType::kBF16));
    compare("d_weight", fdw, udw);
  }
}

}  // namespace
}  // namespace kjit
