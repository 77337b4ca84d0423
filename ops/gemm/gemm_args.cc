#include "ops/gemm/gemm_args.h"

#include <utility>

#include <fmt/format.h>

namespace kjit::ops {

absl::StatusOr<GemmShape> ShapeOf(const GemmArgs& g) {
  for (const auto& [name, v] :
       {std::pair<const char*, const TensorView*>{"a", &g.a}, {"b", &g.b}, {"out", &g.out}}) {
    if (v->empty() || v->rows < 1 || v->cols < 1 || v->row_stride < v->cols) {
      return absl::InvalidArgumentError(
          fmt::format("{}: must be a non-empty matrix with row_stride >= cols", name));
    }
  }
  if (g.b.dtype != g.a.dtype) {
    return absl::InvalidArgumentError(
        fmt::format("b: is {}, a is {}", Name(g.b.dtype), Name(g.a.dtype)));
  }
  if (g.out.dtype != g.a.dtype && g.out.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        fmt::format("out: is {}, must be {} or fp32", Name(g.out.dtype), Name(g.a.dtype)));
  }
  const GemmShape s{.m = g.transpose_a ? g.a.cols : g.a.rows,
                    .n = g.transpose_b ? g.b.rows : g.b.cols,
                    .k = g.transpose_a ? g.a.rows : g.a.cols};
  const int64_t b_inner = g.transpose_b ? g.b.cols : g.b.rows;
  if (b_inner != s.k) {
    return absl::InvalidArgumentError(
        fmt::format("b: op(b) has {} rows, op(a) has {} columns", b_inner, s.k));
  }
  if (g.out.rows != s.m || g.out.cols != s.n) {
    return absl::InvalidArgumentError(
        fmt::format("out: is {}x{}, op(a) op(b) is {}x{}", g.out.rows, g.out.cols, s.m, s.n));
  }
  if (!g.bias.empty() && (g.bias.rows != 1 || g.bias.cols != s.n || g.bias.dtype != g.out.dtype)) {
    return absl::InvalidArgumentError(
        fmt::format("bias: must be a {} vector of {}", Name(g.out.dtype), s.n));
  }
  return s;
}

}  // namespace kjit::ops
