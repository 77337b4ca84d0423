#include "runtime/tensor_checks.h"

#include <gtest/gtest.h>

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

TEST(TensorChecksTest, CheckMatrixAcceptsAGoodView) {
  EXPECT_TRUE(CheckMatrix("x", TensorView::Matrix(At(0x1000), DType::kF32, 3, 5, 7), DType::kF32,
                          3, 5).ok());
  EXPECT_TRUE(CheckMatrix("x", TensorView::Matrix(At(0x1000), DType::kF32, 3, 5), DType::kF32,
                          kAnyRows, 5).ok());
}

}  // namespace
}  // namespace kjit::internal
