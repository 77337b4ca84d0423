// TensorView: a non-owning view of a 2-D array in device memory, rows x cols elements whose rows
// start row_stride elements apart (a row slice of a [batch, seq, hidden] tensor, say). A vector is
// one row. kjit never allocates or frees through a view.
//
//   auto x = kjit::TensorView::Matrix(d_x, kjit::DType::kBF16, tokens, 4096);
//   auto w = kjit::TensorView::Vector(d_w, kjit::DType::kBF16, 4096);
#pragma once

#include <cstdint>

#include "jit/dtype.h"

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

}  // namespace kjit
