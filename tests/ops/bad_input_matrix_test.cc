// The bad-input matrix for the public API: every TensorView / IndexView / workspace argument of
// RmsNorm::Forward/Backward, CrossEntropy::Forward/ForwardBackward/Backward/RescaleGradient,
// ShardedCrossEntropy::ComputeStats/Finish and LogProbs::Forward/Backward, each made null,
// zero-sized, negative, huge (over int32), misaligned, of the wrong dtype, strided shorter than
// its row, and overlapping an argument it must not overlap. Each must be InvalidArgument whose
// message starts with the argument's name; the checks run before the compile-only error, so
// nothing is launched and the fake (never dereferenced) addresses are never touched.
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/cross_entropy.h"
#include "kjit/device_buffer.h"
#include "kjit/log_probs.h"
#include "kjit/rms_norm.h"
#include "kjit/runtime.h"
#include "kjit/sharded_cross_entropy.h"
#include "tests/expect_status.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

constexpr int64_t kRows = 8;
constexpr int64_t kCols = 256;  // hidden / vocab
constexpr int64_t kHuge = int64_t{1} << 40;

void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
void* Offset(void* p, intptr_t bytes) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) + bytes);
}
// Distinct, 1 MiB apart, far from anything real: views here are a few KiB.
void* Slot(int i) { return Addr((uintptr_t{1} << 32) + (static_cast<uintptr_t>(i) << 20)); }

DType OtherDType(DType t) { return t == DType::kF32 ? DType::kBF16 : DType::kF32; }

// One mutation of one argument: what was done, and the name the error must start with.
template <typename Args>
struct Case {
  std::string what;
  std::string name;
  std::function<void(Args&)> mutate;
};

template <typename Args>
void AddTensorCases(std::vector<Case<Args>>& cases, const std::string& name, TensorView Args::*m,
                    bool optional, bool vector = false) {
  auto add = [&](std::string what, std::function<void(TensorView&)> f) {
    cases.push_back({name + " " + what, name, [m, f](Args& a) { f(a.*m); }});
  };
  if (!optional) add("null", [](TensorView& t) { t.data = nullptr; });
  add("zero rows", [](TensorView& t) { t.rows = 0; });
  add("zero cols", [](TensorView& t) { t.cols = 0; });
  add("negative rows", [](TensorView& t) { t.rows = -1; });
  add("negative cols", [](TensorView& t) { t.cols = -1; });
  add("negative row_stride", [](TensorView& t) { t.row_stride = -1; });
  add("huge rows", [](TensorView& t) { t.rows = kHuge; });
  add("huge cols", [](TensorView& t) {
    t.cols = kHuge;
    t.row_stride = kHuge;
  });
  add("int32-overflowing rows", [](TensorView& t) { t.rows = int64_t{1} << 31; });
  // (rows - 1) * row_stride overflows int64 (a one-row view's stride is never used: not bad).
  if (!vector) add("huge row_stride", [](TensorView& t) { t.row_stride = int64_t{1} << 62; });
  add("misaligned", [](TensorView& t) { t.data = Offset(t.data, 1); });
  add("wrong dtype", [](TensorView& t) { t.dtype = OtherDType(t.dtype); });
  add("row_stride shorter than the row", [](TensorView& t) { t.row_stride = t.cols - 1; });
}

template <typename Args>
void AddIndexCases(std::vector<Case<Args>>& cases, const std::string& name, IndexView Args::*m) {
  auto add = [&](std::string what, std::function<void(IndexView&)> f) {
    cases.push_back({name + " " + what, name, [m, f](Args& a) { f(a.*m); }});
  };
  add("null", [](IndexView& v) { v.data = nullptr; });
  add("zero size", [](IndexView& v) { v.size = 0; });
  add("negative size", [](IndexView& v) { v.size = -1; });
  add("huge size", [](IndexView& v) { v.size = kHuge; });
  add("misaligned", [](IndexView& v) { v.data = Offset(v.data, 2); });
  add("wrong type", [](IndexView& v) {
    v.type = v.type == IndexType::kInt64 ? IndexType::kInt32 : IndexType::kInt64;
  });
}

template <typename Args>
void AddWorkspaceCases(std::vector<Case<Args>>& cases) {
  cases.push_back({"workspace null", "workspace", [](Args& a) { a.workspace = nullptr; }});
  cases.push_back(
      {"workspace misaligned", "workspace", [](Args& a) { a.workspace = Offset(a.workspace, 8); }});
  cases.push_back(
      {"workspace_bytes zero", "workspace_bytes", [](Args& a) { a.workspace_bytes = 0; }});
  cases.push_back(
      {"workspace_bytes negative", "workspace_bytes", [](Args& a) { a.workspace_bytes = -1; }});
}

// `out` placed onto `in`: exactly (when aliasing is not allowed) and shifted by 16 bytes (a partial
// overlap, never allowed). The error names `out`.
template <typename Args>
void AddOverlapCases(std::vector<Case<Args>>& cases, const std::string& out_name,
                     TensorView Args::*out, const std::string& in_name, TensorView Args::*in,
                     bool alias_allowed) {
  if (!alias_allowed) {
    cases.push_back({out_name + " aliases " + in_name, out_name,
                     [out, in](Args& a) { (a.*out).data = (a.*in).data; }});
  }
  cases.push_back({out_name + " partially overlaps " + in_name, out_name,
                   [out, in](Args& a) { (a.*out).data = Offset((a.*in).data, 16); }});
}

template <typename Args>
void RunMatrix(const std::vector<Case<Args>>& cases, const std::function<Args()>& good,
               const std::function<absl::Status(const Args&)>& call) {
  {
    absl::Status s = call(good());
    ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
        << "the good arguments must reach the compile-only error: " << s;
  }
  for (const Case<Args>& c : cases) {
    Args a = good();
    c.mutate(a);
    absl::Status s = call(a);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_EQ(ToStd(s.message()).rfind(c.name + ":", 0), 0u)
        << c.what << ": expected the message to start with '" << c.name << ":': " << s;
  }
}

class BadInputMatrixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    auto rt =
        Runtime::Create({.target = "sm_90", .compile_only = true, .cache_dir = dir_ + "/cache"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_.emplace(std::move(*rt));
  }

  testing::TempDir tmp_{"kjit_bad_input"};
  std::string dir_;
  std::optional<Runtime> rt_;
};

// --- RMSNorm -------------------------------------------------------------------------------------

RmsNormForwardArgs GoodRmsForward(bool fused) {
  RmsNormForwardArgs a{.x = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
                       .weight = TensorView::Vector(Slot(2), DType::kF32, kCols),
                       .y = TensorView::Matrix(Slot(3), DType::kBF16, kRows, kCols),
                       .rstd = TensorView::Vector(Slot(4), DType::kF32, kRows)};
  if (fused) {
    a.residual = TensorView::Matrix(Slot(5), DType::kBF16, kRows, kCols);
    a.residual_out = TensorView::Matrix(Slot(6), DType::kBF16, kRows, kCols);
  }
  return a;
}

TEST_F(BadInputMatrixTest, RmsNormForward) {
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused_residual" : "plain");
    auto norm = rt_->RmsNorm({.hidden = kCols,
                              .dtype = DType::kBF16,
                              .weight_dtype = DType::kF32,
                              .fused_residual = fused});
    ASSERT_TRUE(norm.ok()) << norm.status();
    using A = RmsNormForwardArgs;
    std::vector<Case<A>> cases;
    AddTensorCases<A>(cases, "x", &A::x, false);
    AddTensorCases<A>(cases, "weight", &A::weight, false, /*vector=*/true);
    AddTensorCases<A>(cases, "y", &A::y, false);
    AddTensorCases<A>(cases, "rstd", &A::rstd, true, /*vector=*/true);
    // y may be x (in place); every other output/input pair must be disjoint.
    AddOverlapCases<A>(cases, "y", &A::y, "x", &A::x, /*alias_allowed=*/true);
    AddOverlapCases<A>(cases, "y", &A::y, "weight", &A::weight, false);
    AddOverlapCases<A>(cases, "rstd", &A::rstd, "y", &A::y, false);
    AddOverlapCases<A>(cases, "rstd", &A::rstd, "x", &A::x, false);
    AddOverlapCases<A>(cases, "rstd", &A::rstd, "weight", &A::weight, false);
    if (fused) {
      AddTensorCases<A>(cases, "residual", &A::residual, false);
      AddTensorCases<A>(cases, "residual_out", &A::residual_out, false);
      AddOverlapCases<A>(cases, "residual_out", &A::residual_out, "residual", &A::residual, true);
      AddOverlapCases<A>(cases, "residual_out", &A::residual_out, "x", &A::x, false);
      AddOverlapCases<A>(cases, "residual_out", &A::residual_out, "weight", &A::weight, false);
      AddOverlapCases<A>(cases, "y", &A::y, "residual_out", &A::residual_out, false);
      AddOverlapCases<A>(cases, "y", &A::y, "residual", &A::residual, false);
      AddOverlapCases<A>(cases, "rstd", &A::rstd, "residual", &A::residual, false);
      AddOverlapCases<A>(cases, "rstd", &A::rstd, "residual_out", &A::residual_out, false);
    }
    RunMatrix<A>(
        cases, [fused] { return GoodRmsForward(fused); },
        [&](const A& a) { return norm->Forward(nullptr, a); });
  }
}

// Casting none computes in the dtype: a weight dtype of its own is refused when the op is made.
TEST_F(BadInputMatrixTest, RmsNormCastingNoneRefusesAnotherWeightDtype) {
  for (DType w : {DType::kF32, DType::kF16}) {
    auto norm = rt_->RmsNorm({.hidden = kCols,
                              .dtype = DType::kBF16,
                              .weight_dtype = w,
                              .casting = RmsNormCasting::kNone});
    testing::ExpectInvalid(norm.status(), "weight_dtype:");
  }
  EXPECT_TRUE(rt_->RmsNorm({.hidden = kCols,
                            .dtype = DType::kBF16,
                            .weight_dtype = DType::kBF16,
                            .casting = RmsNormCasting::kNone})
                  .ok());
}

TEST_F(BadInputMatrixTest, RmsNormBackward) {
  auto norm = rt_->RmsNorm({.hidden = kCols, .dtype = DType::kBF16, .weight_dtype = DType::kF32});
  ASSERT_TRUE(norm.ok()) << norm.status();
  using A = RmsNormBackwardArgs;
  auto good = [] {
    return A{.dy = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
             .x = TensorView::Matrix(Slot(2), DType::kBF16, kRows, kCols),
             .weight = TensorView::Vector(Slot(3), DType::kF32, kCols),
             .rstd = TensorView::Vector(Slot(4), DType::kF32, kRows),
             .dx = TensorView::Matrix(Slot(5), DType::kBF16, kRows, kCols),
             .dw = TensorView::Vector(Slot(6), DType::kF32, kCols),
             .dresidual = TensorView::Matrix(Slot(7), DType::kBF16, kRows, kCols),
             .workspace = Slot(8),
             .workspace_bytes = 1 << 20};
  };
  std::vector<Case<A>> cases;
  AddTensorCases<A>(cases, "dy", &A::dy, false);
  AddTensorCases<A>(cases, "x", &A::x, false);
  AddTensorCases<A>(cases, "weight", &A::weight, false, /*vector=*/true);
  AddTensorCases<A>(cases, "rstd", &A::rstd, false, /*vector=*/true);
  AddTensorCases<A>(cases, "dx", &A::dx, false);
  AddTensorCases<A>(cases, "dw", &A::dw, false, /*vector=*/true);
  AddTensorCases<A>(cases, "dresidual", &A::dresidual, true);
  cases.push_back({"workspace null", "workspace", [](A& a) { a.workspace = nullptr; }});
  cases.push_back(
      {"workspace misaligned", "workspace", [](A& a) { a.workspace = Offset(a.workspace, 8); }});
  // The fp32 partial sums must not land on any argument.
  cases.push_back({"workspace overlaps dy", "workspace", [](A& a) { a.workspace = a.dy.data; }});
  cases.push_back({"workspace overlaps x", "workspace", [](A& a) { a.workspace = a.x.data; }});
  cases.push_back(
      {"workspace overlaps weight", "workspace", [](A& a) { a.workspace = a.weight.data; }});
  cases.push_back(
      {"workspace overlaps rstd", "workspace", [](A& a) { a.workspace = a.rstd.data; }});
  cases.push_back({"workspace overlaps dx", "workspace", [](A& a) { a.workspace = a.dx.data; }});
  cases.push_back({"workspace overlaps dw", "workspace", [](A& a) { a.workspace = a.dw.data; }});
  cases.push_back(
      {"workspace overlaps dresidual", "workspace", [](A& a) { a.workspace = a.dresidual.data; }});
  // dx may be dy or dresidual (in place); the other pairs must be disjoint.
  AddOverlapCases<A>(cases, "dx", &A::dx, "dy", &A::dy, true);
  AddOverlapCases<A>(cases, "dx", &A::dx, "dresidual", &A::dresidual, true);
  AddOverlapCases<A>(cases, "dx", &A::dx, "x", &A::x, false);
  AddOverlapCases<A>(cases, "dx", &A::dx, "weight", &A::weight, false);
  AddOverlapCases<A>(cases, "dx", &A::dx, "rstd", &A::rstd, false);
  AddOverlapCases<A>(cases, "dw", &A::dw, "dx", &A::dx, false);
  AddOverlapCases<A>(cases, "dw", &A::dw, "dy", &A::dy, false);
  AddOverlapCases<A>(cases, "dw", &A::dw, "x", &A::x, false);
  AddOverlapCases<A>(cases, "dw", &A::dw, "weight", &A::weight, false);
  AddOverlapCases<A>(cases, "dw", &A::dw, "rstd", &A::rstd, false);
  AddOverlapCases<A>(cases, "dw", &A::dw, "dresidual", &A::dresidual, false);
  RunMatrix<A>(cases, good, [&](const A& a) { return norm->Backward(nullptr, a); });
}

// --- Cross-entropy -------------------------------------------------------------------------------

CrossEntropyArgs GoodCe(bool gradient, const CrossEntropy& ce) {
  CrossEntropyArgs a{.logits = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
                     .targets = IndexView::Of(Slot(2), IndexType::kInt64, kRows),
                     .loss = TensorView::Vector(Slot(3), DType::kF32, kRows),
                     .lse = TensorView::Vector(Slot(4), DType::kF32, kRows),
                     .argmax = IndexView::Of(Slot(5), IndexType::kInt64, kRows),
                     .workspace = Slot(8),
                     .workspace_bytes = ce.WorkspaceBytes(kRows)};
  if (gradient) {
    a.grad = TensorView::Matrix(Slot(6), DType::kBF16, kRows, kCols);
    a.grad_output = TensorView::Vector(Slot(7), DType::kF32, kRows);
  }
  return a;
}

TEST_F(BadInputMatrixTest, CrossEntropyForwardAndForwardBackward) {
  auto ce = rt_->CrossEntropy({.vocab = kCols,
                               .dtype = DType::kBF16,
                               .loss = {.reduction = Reduction::kNone, .argmax = true}});
  ASSERT_TRUE(ce.ok()) << ce.status();
  using A = CrossEntropyArgs;
  for (bool gradient : {false, true}) {
    SCOPED_TRACE(gradient ? "ForwardBackward" : "Forward");
    std::vector<Case<A>> cases;
    AddTensorCases<A>(cases, "logits", &A::logits, false);
    AddIndexCases<A>(cases, "targets", &A::targets);
    AddTensorCases<A>(cases, "loss", &A::loss, false, /*vector=*/true);
    AddTensorCases<A>(cases, "lse", &A::lse, true, /*vector=*/true);
    AddIndexCases<A>(cases, "argmax", &A::argmax);
    AddWorkspaceCases<A>(cases);
    AddOverlapCases<A>(cases, "loss", &A::loss, "logits", &A::logits, false);
    AddOverlapCases<A>(cases, "lse", &A::lse, "logits", &A::logits, false);
    if (gradient) {
      AddTensorCases<A>(cases, "grad", &A::grad, false);
      AddTensorCases<A>(cases, "grad_output", &A::grad_output, true, /*vector=*/true);
      AddOverlapCases<A>(cases, "grad", &A::grad, "logits", &A::logits, /*alias_allowed=*/true);
      cases.push_back({"grad aliases logits with another stride", "grad", [](A& a) {
                         a.grad.data = a.logits.data;
                         a.grad.row_stride = a.logits.row_stride + 8;
                       }});
    } else {
      cases.push_back({"grad given to Forward", "grad", [](A& a) {
                         a.grad = TensorView::Matrix(Slot(6), DType::kBF16, kRows, kCols);
                       }});
    }
    RunMatrix<A>(
        cases, [&] { return GoodCe(gradient, *ce); },
        [&](const A& a) {
          return gradient ? ce->ForwardBackward(nullptr, a) : ce->Forward(nullptr, a);
        });
  }
}

TEST_F(BadInputMatrixTest, CrossEntropyBackward) {
  auto ce = rt_->CrossEntropy(
      {.vocab = kCols, .dtype = DType::kBF16, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(ce.ok()) << ce.status();
  using A = CrossEntropyBackwardArgs;
  auto good = [&] {
    return A{.logits = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
             .targets = IndexView::Of(Slot(2), IndexType::kInt64, kRows),
             .lse = TensorView::Vector(Slot(3), DType::kF32, kRows),
             .grad_output = TensorView::Vector(Slot(4), DType::kF32, kRows),
             .grad = TensorView::Matrix(Slot(5), DType::kBF16, kRows, kCols),
             .workspace = Slot(8),
             .workspace_bytes = ce->WorkspaceBytes(kRows)};
  };
  std::vector<Case<A>> cases;
  AddTensorCases<A>(cases, "logits", &A::logits, false);
  AddIndexCases<A>(cases, "targets", &A::targets);
  AddTensorCases<A>(cases, "lse", &A::lse, false, /*vector=*/true);
  AddTensorCases<A>(cases, "grad_output", &A::grad_output, true, /*vector=*/true);
  AddTensorCases<A>(cases, "grad", &A::grad, false);
  AddWorkspaceCases<A>(cases);
  AddOverlapCases<A>(cases, "grad", &A::grad, "logits", &A::logits, /*alias_allowed=*/true);
  AddOverlapCases<A>(cases, "grad", &A::grad, "lse", &A::lse, false);
  AddOverlapCases<A>(cases, "grad", &A::grad, "grad_output", &A::grad_output, false);
  RunMatrix<A>(cases, good, [&](const A& a) { return ce->Backward(nullptr, a); });
}

TEST_F(BadInputMatrixTest, CrossEntropyRescaleGradient) {
  auto ce = rt_->CrossEntropy(
      {.vocab = kCols, .dtype = DType::kBF16, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(ce.ok()) << ce.status();
  using A = CrossEntropyRescaleArgs;
  // grad_output (and applied) hold one value for every row, or one per row.
  for (int64_t n : {int64_t{1}, kRows}) {
    SCOPED_TRACE(n == 1 ? "one value" : "per row");
    auto good = [n] {
      return A{.grad = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
               .grad_output = TensorView::Vector(Slot(2), DType::kF32, n),
               .applied = TensorView::Vector(Slot(3), DType::kF32, n)};
    };
    std::vector<Case<A>> cases;
    AddTensorCases<A>(cases, "grad", &A::grad, false);
    // A grad of zero rows is a no-op, checked below.
    std::erase_if(cases, [](const Case<A>& c) { return c.what == "grad zero rows"; });
    AddTensorCases<A>(cases, "grad_output", &A::grad_output, false, /*vector=*/true);
    AddTensorCases<A>(cases, "applied", &A::applied, true, /*vector=*/true);
    cases.push_back({"grad_output of neither 1 nor rows values", "grad_output", [](A& a) {
                       a.grad_output = TensorView::Vector(a.grad_output.data, DType::kF32, 3);
                     }});
    cases.push_back({"applied of another shape than grad_output", "applied", [n](A& a) {
                       a.applied = TensorView::Vector(a.applied.data, DType::kF32,
                                                      n == 1 ? kRows : int64_t{1});
                     }});
    // (not a structured binding: clang 14 cannot capture one in the lambdas below)
    for (const auto& input :
         {std::pair{std::string("grad_output"), &A::grad_output}, {"applied", &A::applied}}) {
      const std::string& name = input.first;
      TensorView A::*m = input.second;
      if (n > 1) {
        AddOverlapCases<A>(cases, "grad", &A::grad, name, m, false);
      } else {  // one value is too short for grad to start inside it
        cases.push_back({"grad aliases " + name, "grad", [m](A& a) { a.grad.data = (a.*m).data; }});
      }
      cases.push_back({"grad starting before and covering " + name, "grad",
                       [m](A& a) { a.grad.data = Offset((a.*m).data, -16); }});
    }
    RunMatrix<A>(cases, good, [&](const A& a) { return ce->RescaleGradient(nullptr, a); });

    // Both inputs are only read: grad_output may be applied itself, or applied absent (1).
    A same = good();
    same.applied = same.grad_output;
    EXPECT_EQ(ce->RescaleGradient(nullptr, same).code(), absl::StatusCode::kFailedPrecondition);
    A one = good();
    one.applied = {};
    EXPECT_EQ(ce->RescaleGradient(nullptr, one).code(), absl::StatusCode::kFailedPrecondition);
  }
  // No rows: nothing to rescale, nothing launched, even with the null views of empty tensors.
  const absl::Status empty =
      ce->RescaleGradient(nullptr, {.grad = TensorView::Matrix(nullptr, DType::kBF16, 0, kCols)});
  EXPECT_TRUE(empty.ok()) << empty;
}

// --- vocab-parallel cross-entropy ----------------------------------------------------------------

TEST_F(BadInputMatrixTest, ShardedCrossEntropyComputeStatsAndFinish) {
  // The shard [64, 64 + kCols) of a vocab of 4 * kCols.
  auto op = rt_->ShardedCrossEntropy({.vocab = 4 * kCols,
                                      .shard_start = 64,
                                      .shard_end = 64 + kCols,
                                      .dtype = DType::kBF16,
                                      .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(op.ok()) << op.status();
  using A = ShardedCrossEntropyArgs;
  for (bool finish : {false, true}) {
    SCOPED_TRACE(finish ? "Finish" : "ComputeStats");
    auto good = [&] {
      return A{.logits = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
               .targets = IndexView::Of(Slot(2), IndexType::kInt64, kRows),
               .loss = TensorView::Vector(Slot(3), DType::kF32, kRows),
               .lse = TensorView::Vector(Slot(4), DType::kF32, kRows),
               .grad = TensorView::Matrix(Slot(5), DType::kBF16, kRows, kCols),
               .grad_output = TensorView::Vector(Slot(6), DType::kF32, kRows),
               .workspace = Slot(8),
               .workspace_bytes = op->WorkspaceBytes(kRows)};
    };
    std::vector<Case<A>> cases;
    AddTensorCases<A>(cases, "logits", &A::logits, false);
    AddIndexCases<A>(cases, "targets", &A::targets);
    AddWorkspaceCases<A>(cases);
    if (finish) {
      AddTensorCases<A>(cases, "loss", &A::loss, false, /*vector=*/true);
      AddTensorCases<A>(cases, "lse", &A::lse, true, /*vector=*/true);
      AddTensorCases<A>(cases, "grad", &A::grad, true);
      AddTensorCases<A>(cases, "grad_output", &A::grad_output, true, /*vector=*/true);
      AddOverlapCases<A>(cases, "loss", &A::loss, "logits", &A::logits, false);
      AddOverlapCases<A>(cases, "grad", &A::grad, "logits", &A::logits, /*alias_allowed=*/true);
      AddOverlapCases<A>(cases, "grad", &A::grad, "grad_output", &A::grad_output, false);
    }
    RunMatrix<A>(cases, good, [&](const A& a) {
      return finish ? op->Finish(nullptr, a) : op->ComputeStats(nullptr, a);
    });
  }
}

// The statistics steps a caller runs around its own all-reduce, and the one-process combine: their
// bad rows, workspaces and shard lists are refused before anything is launched.
TEST_F(BadInputMatrixTest, ShardedCrossEntropyStatisticsSteps) {
  auto shard = [&](int64_t start, int64_t end) {
    return rt_->ShardedCrossEntropy({.vocab = 4 * kCols,
                                     .shard_start = start,
                                     .shard_end = end,
                                     .dtype = DType::kBF16,
                                     .loss = {.reduction = Reduction::kMean}});
  };
  auto a = shard(0, 2 * kCols), b = shard(2 * kCols, 4 * kCols), gap = shard(3 * kCols, 4 * kCols);
  ASSERT_TRUE(a.ok() && b.ok() && gap.ok());
  using kjit::testing::ExpectInvalid;
  EXPECT_EQ(a->RescaleStats(nullptr, Slot(1), kRows).code(), absl::StatusCode::kFailedPrecondition);
  ExpectInvalid(a->RescaleStats(nullptr, Slot(1), 0), "rows:");
  ExpectInvalid(a->RescaleStats(nullptr, Offset(Slot(1), 8), kRows), "workspace:");
  ExpectInvalid(a->RescaleStats(nullptr, nullptr, kRows), "workspace:");
  ExpectInvalid(a->AllReduceStats(nullptr, Slot(1), -1, nullptr), "rows:");

  using Shard = ShardedCrossEntropy::Shard;
  EXPECT_EQ(
      ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*b, Slot(2)}}, kRows).code(),
      absl::StatusCode::kFailedPrecondition);
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {}, kRows), "shards:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {Shard{nullptr, Slot(1)}}, kRows),
                "shards[0].op:");
  ExpectInvalid(
      ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*gap, Slot(2)}}, kRows),
      "shards[1]:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}}, kRows), "shards:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(
                    nullptr, {{&*a, Slot(1)}, {&*b, Offset(Slot(2), 4)}}, kRows),
                "shards[1].workspace:");
}

// Issue 45, defects 3, 4, 5 and 10 through the C++ API: an all-reduce on a compile-only runtime
// with a communicator that is not one is refused before NCCL is reached (it crashed inside NCCL),
// a bad workspace or row count before the first collective, and CombineStats refuses shards of
// another problem or runtime, one workspace twice, and more shards than it holds.
TEST_F(BadInputMatrixTest, ShardedCrossEntropyCollectivesAndCombinedShards) {
  const ShardedCrossEntropySpec base{.vocab = 4 * kCols,
                                     .shard_start = 0,
                                     .shard_end = 2 * kCols,
                                     .dtype = DType::kBF16,
                                     .loss = {.reduction = Reduction::kMean}};
  auto a = rt_->ShardedCrossEntropy(base);
  ASSERT_TRUE(a.ok()) << a.status();
  using kjit::testing::ExpectInvalid;
  auto* bogus = reinterpret_cast<NcclComm>(Slot(30));  // never dereferenced
  const absl::Status refused = a->AllReduceStats(nullptr, Slot(1), kRows, bogus);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  ExpectInvalid(a->AllReduceStats(nullptr, Offset(Slot(1), 8), kRows, bogus), "workspace:");
  ExpectInvalid(a->AllReduceStats(nullptr, nullptr, kRows, bogus), "workspace:");
  ExpectInvalid(a->AllReduceStats(nullptr, Slot(1), 0, bogus), "rows:");
  ExpectInvalid(a->AllReduceStats(nullptr, Slot(1), kHuge, bogus), "rows:");

  // The second half of the vocab, of `base`'s problem but for what `change` sets.
  auto second = [&](const std::function<void(ShardedCrossEntropySpec&)>& change) {
    ShardedCrossEntropySpec s = base;
    s.shard_start = 2 * kCols;
    s.shard_end = 4 * kCols;
    change(s);
    return s;
  };
  using Shard = ShardedCrossEntropy::Shard;
  const std::vector<std::pair<std::string, std::function<void(ShardedCrossEntropySpec&)>>> others =
      {{"dtype", [](auto& s) { s.dtype = DType::kF16; }},
       {"loss.target_type", [](auto& s) { s.loss.target_type = IndexType::kInt32; }},
       {"loss.ignore_index", [](auto& s) { s.loss.ignore_index = -1; }},
       {"loss.reduction", [](auto& s) { s.loss.reduction = Reduction::kSum; }},
       {"loss.label_smoothing", [](auto& s) { s.loss.label_smoothing = 0.1f; }},
       {"loss.z_loss", [](auto& s) { s.loss.z_loss = 1e-4f; }},
       {"loss.softcap", [](auto& s) { s.loss.softcap = 30.0f; }},
       {"loss.class_weight_dtype", [](auto& s) { s.loss.class_weight_dtype = DType::kF32; }}};
  for (const auto& [field, change] : others) {
    auto b = rt_->ShardedCrossEntropy(second(change));
    ASSERT_TRUE(b.ok()) << field << ": " << b.status();
    ExpectInvalid(
        ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*b, Slot(2)}}, kRows),
        "shards[1]: " + field + ":");
  }
  auto b = rt_->ShardedCrossEntropy(second([](auto&) {}));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(
      ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*b, Slot(2)}}, kRows).code(),
      absl::StatusCode::kFailedPrecondition);
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*b, Slot(1)}}, kRows),
                "shards[1].workspace:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(
                    nullptr, {{&*a, Slot(1)}, {&*b, Offset(Slot(1), 16)}}, kRows),
                "shards[1].workspace:");
  auto other_rt = Runtime::Create({.target = "sm_90", .compile_only = true, .disk_cache = false});
  ASSERT_TRUE(other_rt.ok()) << other_rt.status();
  auto foreign = other_rt->ShardedCrossEntropy(second([](auto&) {}));
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  ExpectInvalid(
      ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*foreign, Slot(2)}}, kRows),
      "shards[1].op:");
  // More shards than one combine holds: refused before any is read.
  std::vector<Shard> many(ShardedCrossEntropy::kMaxCombinedShards + 1, Shard{&*a, Slot(1)});
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, many, kRows), "shards:");
  ExpectInvalid(ShardedCrossEntropy::CombineStats(nullptr, {{&*a, Slot(1)}, {&*b, Slot(2)}}, 0),
                "rows:");
}

// --- RL heads ------------------------------------------------------------------------------------

LogProbsArgs GoodLogProbs(bool entropy) {
  LogProbsArgs a{.logits = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
                 .targets = IndexView::Of(Slot(2), IndexType::kInt64, kRows),
                 .logprob = TensorView::Vector(Slot(3), DType::kF32, kRows),
                 .lse = TensorView::Vector(Slot(5), DType::kF32, kRows)};
  if (entropy) a.entropy = TensorView::Vector(Slot(4), DType::kF32, kRows);
  return a;
}

TEST_F(BadInputMatrixTest, LogProbsForward) {
  for (bool entropy : {false, true}) {
    SCOPED_TRACE(entropy ? "entropy" : "log-probs alone");
    auto op = rt_->LogProbs(
        {.vocab = kCols, .dtype = DType::kBF16, .temperature = 0.7f, .entropy = entropy});
    ASSERT_TRUE(op.ok()) << op.status();
    using A = LogProbsArgs;
    std::vector<Case<A>> cases;
    AddTensorCases<A>(cases, "logits", &A::logits, false);
    AddIndexCases<A>(cases, "targets", &A::targets);
    AddTensorCases<A>(cases, "logprob", &A::logprob, false, /*vector=*/true);
    AddTensorCases<A>(cases, "lse", &A::lse, true, /*vector=*/true);
    AddOverlapCases<A>(cases, "logprob", &A::logprob, "logits", &A::logits, false);
    AddOverlapCases<A>(cases, "lse", &A::lse, "logits", &A::logits, false);
    AddOverlapCases<A>(cases, "lse", &A::lse, "logprob", &A::logprob, false);
    cases.push_back(
        {"logprob over targets", "logprob", [](A& a) { a.logprob.data = a.targets.data; }});
    if (entropy) {
      AddTensorCases<A>(cases, "entropy", &A::entropy, false, /*vector=*/true);
      AddOverlapCases<A>(cases, "entropy", &A::entropy, "logprob", &A::logprob, false);
      AddOverlapCases<A>(cases, "entropy", &A::entropy, "logits", &A::logits, false);
      AddOverlapCases<A>(cases, "lse", &A::lse, "entropy", &A::entropy, false);
    } else {
      cases.push_back({"entropy given to an op without it", "entropy",
                       [](A& a) { a.entropy = TensorView::Vector(Slot(4), DType::kF32, kRows); }});
    }
    RunMatrix<A>(
        cases, [entropy] { return GoodLogProbs(entropy); },
        [&](const A& a) { return op->Forward(nullptr, a); });
  }
}

TEST_F(BadInputMatrixTest, LogProbsBackward) {
  auto op = rt_->LogProbs({.vocab = kCols, .dtype = DType::kBF16, .entropy = true});
  ASSERT_TRUE(op.ok()) << op.status();
  using A = LogProbsBackwardArgs;
  auto good = [] {
    return A{.logits = TensorView::Matrix(Slot(1), DType::kBF16, kRows, kCols),
             .targets = IndexView::Of(Slot(2), IndexType::kInt64, kRows),
             .lse = TensorView::Vector(Slot(3), DType::kF32, kRows),
             .entropy = TensorView::Vector(Slot(4), DType::kF32, kRows),
             .grad_logprob = TensorView::Vector(Slot(5), DType::kF32, kRows),
             .grad_entropy = TensorView::Vector(Slot(6), DType::kF32, kRows),
             .grad = TensorView::Matrix(Slot(7), DType::kBF16, kRows, kCols)};
  };
  std::vector<Case<A>> cases;
  AddTensorCases<A>(cases, "logits", &A::logits, false);
  AddIndexCases<A>(cases, "targets", &A::targets);
  AddTensorCases<A>(cases, "lse", &A::lse, false, /*vector=*/true);
  // entropy is required while grad_entropy is given.
  AddTensorCases<A>(cases, "entropy", &A::entropy, false, /*vector=*/true);
  AddTensorCases<A>(cases, "grad_logprob", &A::grad_logprob, true, /*vector=*/true);
  AddTensorCases<A>(cases, "grad_entropy", &A::grad_entropy, true, /*vector=*/true);
  AddTensorCases<A>(cases, "grad", &A::grad, false);
  AddOverlapCases<A>(cases, "grad", &A::grad, "logits", &A::logits, /*alias_allowed=*/true);
  for (const auto& input : {std::pair{std::string("lse"), &A::lse},
                            {"entropy", &A::entropy},
                            {"grad_logprob", &A::grad_logprob},
                            {"grad_entropy", &A::grad_entropy}}) {
    AddOverlapCases<A>(cases, "grad", &A::grad, input.first, input.second, false);
  }
  cases.push_back({"grad over targets", "grad", [](A& a) { a.grad.data = a.targets.data; }});
  cases.push_back({"grad aliases logits with another stride", "grad", [](A& a) {
                     a.grad.data = a.logits.data;
                     a.grad.row_stride = a.logits.row_stride + 8;
                   }});
  RunMatrix<A>(cases, good, [&](const A& a) { return op->Backward(nullptr, a); });

  // Without grad_entropy, entropy is optional (and neither upstream gradient is required).
  A without = good();
  without.entropy = {};
  without.grad_entropy = {};
  without.grad_logprob = {};
  EXPECT_EQ(op->Backward(nullptr, without).code(), absl::StatusCode::kFailedPrecondition);
}

// DeviceBuffer on a compile-only runtime: a clear error, not a crash.
TEST_F(BadInputMatrixTest, DeviceBufferNeedsADevice) {
  auto buffer = DeviceBuffer::Create(*rt_, 64);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kFailedPrecondition) << buffer.status();
  EXPECT_EQ(UploadValues(*rt_, {1.0, 2.0}, DType::kBF16).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kjit
