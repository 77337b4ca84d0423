// Non-owning views of device memory that ops take as arguments. kjit never allocates or frees
// through a view.
//
// TensorView: rows x cols elements whose rows start row_stride elements apart (a row slice of a
// [batch, seq, hidden] tensor, say); a vector is one row. IndexView: a contiguous vector of
// integers (targets, argmax).
//
//   auto x = kjit::TensorView::Matrix(d_x, kjit::DType::kBF16, tokens, 4096);
//   auto w = kjit::TensorView::Vector(d_w, kjit::DType::kBF16, 4096);
//   auto t = kjit::IndexView::Of(d_targets, kjit::IndexType::kInt64, tokens);
#pragma once

#include <cstddef>
#include <cstdint>

#include "kjit/dtype.h"

namespace kjit {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements; >= cols

  static TensorView Matrix(void* data, DType dtype, int64_t rows, int64_t cols,
                           int64_t row_stride = -1) {
    return {data, dtype, rows, cols, row_stride < 0 ? cols : row_stride};
  }
  static TensorView Vector(void* data, DType dtype, int64_t n) { return {data, dtype, 1, n, n}; }
  bool empty() const { return data == nullptr; }
};

enum class IndexType { kInt32, kInt64 };
const char* Name(IndexType t);  // "int32", "int64"
size_t SizeOf(IndexType t);

struct IndexView {
  void* data = nullptr;
  IndexType type = IndexType::kInt64;
  int64_t size = 0;
  static IndexView Of(void* data, IndexType type, int64_t size) { return {data, type, size}; }
  bool empty() const { return data == nullptr; }
};

}  // namespace kjit
