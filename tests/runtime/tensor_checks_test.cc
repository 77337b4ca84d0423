#include "runtime/tensor_checks.h"

#include <gtest/gtest.h>

#include "jit/status_helpers.h"

namespace kjit::internal {
namespace {

void* At(uintptr_t a) { return reinterpret_cast<void*>(a); }

TEST(TensorChecksTest, PartialOverlapButNotExactAliasOrInterleavedColumns) {
  const auto a = TensorView::Matrix(At(0x1000), DType::kBF16, 4, 8);
  EXPECT_FALSE(PartiallyOverlaps(a, a)) << "exact aliasing is in-place, not overlap";
  EXPECT_TRUE(PartiallyOverlaps(a, TensorView::Matrix(At(0x1002), DType::kBF16, 4, 8)));
  EXPECT_FALSE(PartiallyOverlaps(a, TensorView::Matrix(At(0x1000 + 64), DType::kBF16, 4, 8)));
  // Two column halves of one [4, 16] buffer interleave but share no element.
  const auto left = TensorView::Matrix(At(0x1000), DType::kBF16, 4, 8, 16);
  const auto right = TensorView::Matrix(At(0x1000 + 16), DType::kBF16, 4, 8, 16);
  EXPECT_FALSE(PartiallyOverlaps(left, right));
  EXPECT_TRUE(PartiallyOverlaps(left, TensorView::Matrix(At(0x1000 + 14), DType::kBF16, 4, 8, 16)));
}

TEST(TensorChecksTest, WidestAlignedVecFollowsPointersAndStrides) {
  auto v = TensorView::Matrix(At(0x1000), DType::kBF16, 4, 64);
  EXPECT_EQ(WidestAlignedVec(8, {&v}), 8);
  auto odd_ptr = TensorView::Matrix(At(0x1002), DType::kBF16, 4, 64);
  EXPECT_EQ(WidestAlignedVec(8, {&v, &odd_ptr}), 1);
  auto four = TensorView::Matrix(At(0x1008), DType::kBF16, 4, 64);
  EXPECT_EQ(WidestAlignedVec(8, {&four}), 4);
  auto stride = TensorView::Matrix(At(0x1000), DType::kBF16, 4, 64, 66);
  EXPECT_EQ(WidestAlignedVec(8, {&stride}), 2);
  TensorView empty;
  EXPECT_EQ(WidestAlignedVec(8, {&v, &empty}), 8);
}

TEST(TensorChecksTest, WidestVecAlignedAlikeNarrowsOnlyForViewsThatDifferFromTheLead) {
  // Odd offsets and strides alone do not narrow: each row has the lead's head before its vectors.
  const auto lead = TensorView::Matrix(At(0x1002), DType::kBF16, 4, 50257);
  EXPECT_EQ(WidestVecAlignedAlike(8, lead, {}), 8);
  EXPECT_EQ(WidestVecAlignedAlike(8, lead, {&lead}), 8);
  EXPECT_EQ(WidestVecAlignedAlike(8, lead, {nullptr}), 8);
  // 16 bytes further: the same misalignment.
  const auto alike = TensorView::Matrix(At(0x1012), DType::kBF16, 4, 50257);
  EXPECT_EQ(WidestVecAlignedAlike(8, lead, {&alike}), 8);
  // 4 bytes (2 elements) further: rows split alike only by pairs.
  const auto two_off = TensorView::Matrix(At(0x1006), DType::kBF16, 4, 50257);
  EXPECT_EQ(WidestVecAlignedAlike(8, lead, {&two_off}), 2);
  // The same start but a stride 4 elements longer: row 1 is 4 elements further off.
  const auto wider = TensorView::Matrix(At(0x1002), DType::kBF16, 4, 50257, 50261);
  EXPECT_EQ(WidestVecAlignedAlike(8, lead, {&wider}), 4);
  // A single row's stride does not matter.
  const auto one_row = TensorView::Matrix(At(0x1002), DType::kBF16, 1, 50257, 50261);
  EXPECT_EQ(
      WidestVecAlignedAlike(8, TensorView::Matrix(At(0x1002), DType::kBF16, 1, 50257), {&one_row}),
      8);
}

TEST(TensorChecksTest, CheckMatrixAcceptsAGoodView) {
  EXPECT_TRUE(
      CheckMatrix("x", TensorView::Matrix(At(0x1000), DType::kF32, 3, 5, 7), DType::kF32, 3, 5)
          .ok());
  EXPECT_TRUE(
      CheckMatrix("x", TensorView::Matrix(At(0x1000), DType::kF32, 3, 5), DType::kF32, kAnyRows, 5)
          .ok());
}

// Every op reports a clash through CheckDisjoint, so one condition reads the same in every op.
TEST(TensorChecksTest, CheckDisjointNamesTheLaterOutputAndAllowsOnlyListedInPlacePairs) {
  const TensorView x = TensorView::Matrix(At(0x10000), DType::kBF16, 4, 64);
  const TensorView y = TensorView::Matrix(At(0x20000), DType::kBF16, 4, 64);
  const TensorView rstd = TensorView::Vector(At(0x30000), DType::kF32, 4);
  EXPECT_TRUE(CheckDisjoint({{"y", y}, {"rstd", rstd}}, {{"x", x}}).ok());
  EXPECT_TRUE(CheckDisjoint({{"y", x}, {"rstd", rstd}}, {{"x", x}}, {{"y", "x"}}).ok());
  EXPECT_EQ(ToStd(CheckDisjoint({{"y", x}}, {{"x", x}}).message()), "y: must not alias x");
  const TensorView shifted = TensorView::Matrix(At(0x10000 + 16), DType::kBF16, 4, 64);
  EXPECT_EQ(ToStd(CheckDisjoint({{"y", shifted}}, {{"x", x}}, {{"y", "x"}}).message()),
            "y: overlaps x (only exact in-place aliasing is allowed)");
  EXPECT_EQ(ToStd(CheckDisjoint({{"y", y}, {"rstd", BytesOf(At(0x20000), 16)}}, {}).message()),
            "rstd: must not alias y");
  const IndexView targets = IndexView::Of(At(0x30000 + 8), IndexType::kInt64, 4);
  EXPECT_EQ(ToStd(CheckDisjoint({{"rstd", rstd}}, {{"targets", BytesOf(targets)}}).message()),
            "rstd: overlaps targets (only exact in-place aliasing is allowed)");
}

TEST(TensorChecksTest, CheckWorkspaceSaysWhatIsNeeded) {
  EXPECT_EQ(ToStd(CheckWorkspace(nullptr, 0, 64, "WorkspaceBytes(rows)").message()),
            "workspace: null; pass WorkspaceBytes(rows) = 64 bytes of device memory");
  EXPECT_EQ(ToStd(CheckWorkspace(At(0x1008), 64, 64, "X").message()),
            "workspace: must be 16-byte aligned");
  EXPECT_EQ(ToStd(CheckWorkspace(At(0x1000), 32, 64, "X").message()),
            "workspace_bytes: 32 is too small, need X = 64");
  EXPECT_TRUE(CheckWorkspace(At(0x1000), 64, 64, "X").ok());
}

}  // namespace
}  // namespace kjit::internal
