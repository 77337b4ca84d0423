// The fused linear + cross-entropy's argument checks through a compile-only runtime: valid
// arguments reach the compile-only error, each bad one is refused naming it, nothing is launched.
#include "kjit/linear_cross_entropy.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/expect_status.h"
#include "tests/ops/linear_cross_entropy/test_support.h"

namespace kjit {
namespace {

using testing::Contains;
using testing::ExpectInvalid;
using testing::LinearCrossEntropyRuntimeTest;

// Fake device addresses, never dereferenced: the checks run before the compile-only error.
void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
void* Offset(const void* p, intptr_t bytes) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + bytes);
}
// Distinct, 16 MiB apart, far from anything real: views here are a few hundred KiB.
void* Slot(int i) { return Addr((uintptr_t{1} << 36) + (static_cast<uintptr_t>(i) << 24)); }
void* WorkspaceAddr() { return Addr(uintptr_t{1} << 40); }  // WorkspaceBytes is over 32 MiB

constexpr int64_t kRows = 8, kVocab = 1000, kHidden = 64;

class LinearCrossEntropyBadInputTest : public LinearCrossEntropyRuntimeTest {
 protected:
  // Everything a ForwardBackward of the spec can take, valid.
  static LinearCrossEntropyArgs GoodArgs(const LinearCrossEntropySpec& s, int64_t ws_bytes) {
    LinearCrossEntropyArgs a{
        .hidden_states = TensorView::Matrix(Slot(1), s.dtype, kRows, s.hidden),
        .weight = TensorView::Matrix(Slot(2), s.dtype, s.vocab, s.hidden),
        .targets = IndexView::Of(Slot(4), s.loss.target_type, kRows),
        .loss = TensorView::Vector(Slot(5), DType::kF32,
                                   s.loss.reduction == Reduction::kNone ? kRows : 1),
        .lse = TensorView::Vector(Slot(6), DType::kF32, kRows),
        .d_hidden = TensorView::Matrix(Slot(9), s.dtype, kRows, s.hidden),
        .d_weight = TensorView::Matrix(Slot(10), s.weight_grad(), s.vocab, s.hidden),
        .workspace = WorkspaceAddr(),
        .workspace_bytes = ws_bytes};
    if (s.bias) {
      a.bias = TensorView::Vector(Slot(3), s.dtype, s.vocab);
      a.d_bias = TensorView::Vector(Slot(11), s.weight_grad(), s.vocab);
    }
    if (s.loss.argmax) a.argmax = IndexView::Of(Slot(7), s.loss.target_type, kRows);
    a.grad_output =
        TensorView::Vector(Slot(8), DType::kF32, s.loss.reduction == Reduction::kNone ? kRows : 1);
    return a;
  }
  static LinearCrossEntropyArgs ForwardOnly(LinearCrossEntropyArgs a) {
    a.grad_output = a.d_hidden = a.d_weight = a.d_bias = TensorView{};
    return a;
  }
};

TEST_F(LinearCrossEntropyBadInputTest, ValidArgumentsReachTheCompileOnlyError) {
  for (bool bias : {false, true}) {
    for (bool argmax : {false, true}) {
      for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
        for (DType wg : {DType::kBF16, DType::kF32}) {
          const LinearCrossEntropySpec s{
              .vocab = kVocab,
              .hidden = kHidden,
              .dtype = DType::kBF16,
              .weight_grad_dtype = wg,
              .bias = bias,
              .loss = {.target_type = IndexType::kInt32, .reduction = r, .argmax = argmax}};
          SCOPED_TRACE(fmt::format("bias {} argmax {} {} {}", bias, argmax, Name(r), Name(wg)));
          auto op = rt_->LinearCrossEntropy(s);
          ASSERT_TRUE(op.ok()) << op.status();
          const LinearCrossEntropyArgs a = GoodArgs(s, op->WorkspaceBytes(kRows));
          absl::Status fb = op->ForwardBackward(nullptr, a);
          EXPECT_EQ(fb.code(), absl::StatusCode::kFailedPrecondition) << fb;
          absl::Status f = op->Forward(nullptr, ForwardOnly(a));
          EXPECT_EQ(f.code(), absl::StatusCode::kFailedPrecondition) << f;
          // The gradients are each optional.
          LinearCrossEntropyArgs loss_only = a;
          loss_only.d_hidden = loss_only.d_weight = loss_only.d_bias = loss_only.grad_output =
              loss_only.lse = TensorView{};
          absl::Status lo = op->ForwardBackward(nullptr, loss_only);
          EXPECT_EQ(lo.code(), absl::StatusCode::kFailedPrecondition) << lo;
        }
      }
    }
  }
}

TEST_F(LinearCrossEntropyBadInputTest, RescaleGradientsChecksEachArgument) {
  const LinearCrossEntropySpec s{.vocab = kVocab,
                                 .hidden = kHidden,
                                 .dtype = DType::kBF16,
                                 .weight_grad_dtype = DType::kF32,
                                 .bias = true};
  auto op = rt_->LinearCrossEntropy(s);
  ASSERT_TRUE(op.ok()) << op.status();
  const LinearCrossEntropyRescaleArgs good{
      .d_hidden = TensorView::Matrix(Slot(9), DType::kBF16, kRows, kHidden),
      .d_weight = TensorView::Matrix(Slot(10), DType::kF32, kVocab, kHidden),
      .d_bias = TensorView::Vector(Slot(11), DType::kF32, kVocab),
      .grad_output = TensorView::Vector(Slot(8), DType::kF32, 1),
      .applied = TensorView::Vector(Slot(12), DType::kF32, 1)};
  // Valid, also with any of the gradients or applied left out: only the device is missing.
  for (int skip = 0; skip < 16; ++skip) {
    LinearCrossEntropyRescaleArgs a = good;
    if (skip & 1) a.d_hidden = TensorView{};
    if (skip & 2) a.d_weight = TensorView{};
    if (skip & 4) a.d_bias = TensorView{};
    if (skip & 8) a.applied = TensorView{};
    const absl::Status st = op->RescaleGradients(nullptr, a);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << skip << ": " << st;
  }
  struct Case {
    std::string prefix;
    std::function<void(LinearCrossEntropyRescaleArgs&)> mutate;
  };
  const std::vector<Case> cases = {
      {"d_hidden:", [](auto& a) { a.d_hidden.cols = a.d_hidden.row_stride = kHidden + 1; }},
      {"d_hidden:", [](auto& a) { a.d_hidden.dtype = DType::kF32; }},
      {"d_weight:", [](auto& a) { a.d_weight.dtype = DType::kBF16; }},
      {"d_weight:", [](auto& a) { a.d_weight.rows = kVocab - 1; }},
      {"d_bias:",
       [](auto& a) { a.d_bias = TensorView::Vector(Slot(11), DType::kF32, kVocab + 1); }},
      {"grad_output:", [](auto& a) { a.grad_output = TensorView{}; }},
      {"grad_output:",
       [](auto& a) { a.grad_output = TensorView::Vector(Slot(8), DType::kF32, 2); }},
      {"grad_output:", [](auto& a) { a.grad_output.dtype = DType::kBF16; }},
      {"applied:", [](auto& a) { a.applied = TensorView::Vector(Slot(12), DType::kF32, kRows); }},
      {"d_weight:", [](auto& a) { a.d_weight.data = a.grad_output.data; }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    LinearCrossEntropyRescaleArgs a = good;
    cases[i].mutate(a);
    SCOPED_TRACE(i);
    ExpectInvalid(op->RescaleGradients(nullptr, a), cases[i].prefix);
  }
  // No bias in the spec; reduction none, whose per-row upstream gradients do not scale d_weight.
  auto plain = rt_->LinearCrossEntropy({.vocab = kVocab, .hidden = kHidden});
  ASSERT_TRUE(plain.ok()) << plain.status();
  LinearCrossEntropyRescaleArgs with_bias = good;
  with_bias.d_hidden = with_bias.d_weight = TensorView{};
  ExpectInvalid(plain->RescaleGradients(nullptr, with_bias), "d_bias:");
  auto none = rt_->LinearCrossEntropy(
      {.vocab = kVocab, .hidden = kHidden, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(none.ok()) << none.status();
  const absl::Status st = none->RescaleGradients(nullptr, {.grad_output = good.grad_output});
  ExpectInvalid(st, "RescaleGradients:");
  EXPECT_TRUE(Contains(st, "ForwardBackward")) << st;
}

TEST_F(LinearCrossEntropyBadInputTest, EachBadArgumentIsNamed) {
  const LinearCrossEntropySpec mean{.vocab = kVocab, .hidden = kHidden, .dtype = DType::kBF16};
  auto op = rt_->LinearCrossEntropy(mean);
  ASSERT_TRUE(op.ok()) << op.status();
  const int64_t ws = op->WorkspaceBytes(kRows);
  struct Case {
    std::string what;
    std::string prefix;  // the message must start with it
    std::function<void(LinearCrossEntropyArgs&)> mutate;
    std::string also = "";  // and contain this
  };
  const std::vector<Case> cases = {
      {"hidden_states wrong cols", "hidden_states:",
       [](auto& a) { a.hidden_states.cols = a.hidden_states.row_stride = kHidden + 1; }},
      {"hidden_states null", "hidden_states:", [](auto& a) { a.hidden_states.data = nullptr; }},
      {"hidden_states zero rows", "hidden_states:", [](auto& a) { a.hidden_states.rows = 0; }},
      {"hidden_states fp16",
       "hidden_states:", [](auto& a) { a.hidden_states.dtype = DType::kF16; }},
      {"weight wrong rows", "weight:", [](auto& a) { a.weight.rows = kVocab - 1; }},
      {"weight wrong cols", "weight:", [](auto& a) { a.weight.cols = a.weight.row_stride = 32; }},
      {"weight null", "weight:", [](auto& a) { a.weight.data = nullptr; }},
      {"bias without spec.bias",
       "bias:", [](auto& a) { a.bias = TensorView::Vector(Slot(3), DType::kBF16, kVocab); },
       "without a bias"},
      {"d_bias without spec.bias",
       "d_bias:", [](auto& a) { a.d_bias = TensorView::Vector(Slot(11), DType::kBF16, kVocab); },
       "without a bias"},
      {"targets wrong size", "targets:", [](auto& a) { a.targets.size = kRows + 1; }},
      {"targets int32", "targets:", [](auto& a) { a.targets.type = IndexType::kInt32; }},
      {"targets null", "targets:", [](auto& a) { a.targets.data = nullptr; }},
      {"loss per row for the mean",
       "loss:", [](auto& a) { a.loss = TensorView::Vector(Slot(5), DType::kF32, kRows); }},
      {"loss bf16", "loss:", [](auto& a) { a.loss.dtype = DType::kBF16; }},
      {"loss null", "loss:", [](auto& a) { a.loss.data = nullptr; }},
      {"lse wrong size",
       "lse:", [](auto& a) { a.lse = TensorView::Vector(Slot(6), DType::kF32, kRows - 1); }},
      {"argmax without spec.argmax",
       "argmax:", [](auto& a) { a.argmax = IndexView::Of(Slot(7), IndexType::kInt64, kRows); },
       "without argmax"},
      {"grad_output per row for the mean", "grad_output:",
       [](auto& a) { a.grad_output = TensorView::Vector(Slot(8), DType::kF32, kRows); }},
      {"d_hidden wrong rows", "d_hidden:", [](auto& a) { a.d_hidden.rows = kRows - 1; }},
      {"d_weight fp16 for a bf16 op", "d_weight:", [](auto& a) { a.d_weight.dtype = DType::kF16; },
       "fp16"},
      {"d_weight fp32 for a bf16 d_weight",
       "d_weight:", [](auto& a) { a.d_weight.dtype = DType::kF32; }},
      {"d_weight wrong rows", "d_weight:", [](auto& a) { a.d_weight.rows = kVocab + 1; }},
      {"workspace too small", "workspace_bytes:", [ws](auto& a) { a.workspace_bytes = ws - 1; },
       "WorkspaceBytes"},
      {"workspace null", "workspace:", [](auto& a) { a.workspace = nullptr; }, "WorkspaceBytes"},
      {"workspace 16-byte aligned only", "workspace:",
       [](auto& a) { a.workspace = Offset(WorkspaceAddr(), 16); }, "256-byte aligned"},
      {"workspace 128-byte aligned only", "workspace:",
       [](auto& a) { a.workspace = Offset(WorkspaceAddr(), 128); }, "256-byte aligned"},
      {"workspace misaligned",
       "workspace:", [](auto& a) { a.workspace = Offset(WorkspaceAddr(), 4); }},
      {"d_hidden aliases hidden_states",
       "d_hidden:", [](auto& a) { a.d_hidden.data = a.hidden_states.data; }, "hidden_states"},
      {"d_hidden overlaps hidden_states", "d_hidden:",
       [](auto& a) { a.d_hidden.data = Offset(a.hidden_states.data, 16); }, "hidden_states"},
      {"d_weight aliases weight", "d_weight:", [](auto& a) { a.d_weight.data = a.weight.data; },
       "weight"},
      {"loss overlaps targets", "loss:", [](auto& a) { a.loss.data = a.targets.data; }, "targets"},
      {"lse overlaps d_hidden", "d_hidden:", [](auto& a) { a.lse.data = a.d_hidden.data; }, "lse"},
      {"workspace overlaps weight", "workspace:", [](auto& a) { a.workspace = a.weight.data; },
       "weight"},
  };
  for (const Case& c : cases) {
    LinearCrossEntropyArgs a = GoodArgs(mean, ws);
    c.mutate(a);
    const absl::Status s = op->ForwardBackward(nullptr, a);
    SCOPED_TRACE(c.what);
    ExpectInvalid(s, c.prefix);
    if (!c.also.empty()) {
      EXPECT_TRUE(Contains(s, c.also)) << "expected '" << c.also << "': " << s;
    }
  }

  // Forward computes no gradient: each gradient argument is refused, pointing to ForwardBackward.
  const LinearCrossEntropyArgs good = GoodArgs(mean, ws);
  for (const auto& [name, member] : {std::pair<const char*, TensorView LinearCrossEntropyArgs::*>{
                                         "d_weight", &LinearCrossEntropyArgs::d_weight},
                                     {"d_hidden", &LinearCrossEntropyArgs::d_hidden},
                                     {"grad_output", &LinearCrossEntropyArgs::grad_output}}) {
    LinearCrossEntropyArgs a = ForwardOnly(good);
    a.*member = good.*member;
    const absl::Status s = op->Forward(nullptr, a);
    ExpectInvalid(s, std::string(name) + ":");
    EXPECT_TRUE(Contains(s, "ForwardBackward")) << s;
  }

  // Reduction none: the loss (and grad_output) per row.
  auto none = rt_->LinearCrossEntropy({.vocab = kVocab,
                                       .hidden = kHidden,
                                       .dtype = DType::kBF16,
                                       .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(none.ok()) << none.status();
  {
    LinearCrossEntropyArgs a = GoodArgs(none->spec(), none->WorkspaceBytes(kRows));
    a.loss = TensorView::Vector(Slot(5), DType::kF32, 1);
    ExpectInvalid(none->ForwardBackward(nullptr, a), "loss:");
    a = GoodArgs(none->spec(), none->WorkspaceBytes(kRows));
    a.grad_output = TensorView::Vector(Slot(8), DType::kF32, 1);
    ExpectInvalid(none->ForwardBackward(nullptr, a), "grad_output:");
  }

  // With a bias and argmax: the bias and its gradient are checked, argmax is required.
  LinearCrossEntropySpec full = mean;
  full.bias = true;
  full.loss.argmax = true;
  full.weight_grad_dtype = DType::kF32;
  auto op_full = rt_->LinearCrossEntropy(full);
  ASSERT_TRUE(op_full.ok()) << op_full.status();
  const int64_t ws_full = op_full->WorkspaceBytes(kRows);
  const std::vector<Case> full_cases = {
      {"bias missing", "bias:", [](auto& a) { a.bias = TensorView{}; }},
      {"bias wrong size", "bias:", [](auto& a) { a.bias.cols = a.bias.row_stride = kVocab - 1; }},
      {"d_bias bf16 for an fp32 weight gradient",
       "d_bias:", [](auto& a) { a.d_bias.dtype = DType::kBF16; }},
      {"d_weight bf16 for an fp32 weight gradient",
       "d_weight:", [](auto& a) { a.d_weight.dtype = DType::kBF16; }},
      {"argmax missing", "argmax:", [](auto& a) { a.argmax = IndexView{}; }},
      {"argmax wrong size", "argmax:", [](auto& a) { a.argmax.size = kRows - 1; }},
      {"d_bias overlaps bias", "d_bias:", [](auto& a) { a.d_bias.data = a.bias.data; }, "bias"},
      {"workspace a byte short", "workspace_bytes:",
       [ws_full](auto& a) { a.workspace_bytes = ws_full - 1; }, "WorkspaceBytes"},
  };
  for (const Case& c : full_cases) {
    LinearCrossEntropyArgs a = GoodArgs(full, ws_full);
    c.mutate(a);
    const absl::Status s = op_full->ForwardBackward(nullptr, a);
    SCOPED_TRACE(c.what);
    ExpectInvalid(s, c.prefix);
    if (!c.also.empty()) {
      EXPECT_TRUE(Contains(s, c.also)) << "expected '" << c.also << "': " << s;
    }
  }
  const absl::Status ok_full = op_full->ForwardBackward(nullptr, GoodArgs(full, ws_full));
  EXPECT_EQ(ok_full.code(), absl::StatusCode::kFailedPrecondition) << ok_full;
}

}  // namespace
}  // namespace kjit
