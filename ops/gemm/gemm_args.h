// GemmArgs: one GEMM stated on row-major views, as a framework would, whichever engine runs it
// (cuBLASLt through LtGemm, or kjit's own Hopper GEMM through HopperGemm). No GPU needed.
//
//   // logits = h · Wᵀ: h is [rows, hidden], W is [vocab, hidden]
//   GemmArgs g{.a = h, .b = w, .transpose_b = true, .out = logits};
//   KJIT_ASSIGN_OR_RETURN(GemmShape s, ShapeOf(g));   // s.m = rows, s.n = vocab, s.k = hidden
#pragma once

#include <cstdint>

#include "kjit/status.h"
#include "kjit/tensor.h"

namespace kjit::ops {

// out = op(a) · op(b) [+ bias] + beta · out, op transposing when asked, accumulated in fp32. a and
// b share a dtype (bf16, fp16 or fp32); out is that dtype or fp32; bias (a row vector added to
// every row of out) has out's dtype.
struct GemmArgs {
  TensorView a;
  bool transpose_a = false;
  TensorView b;
  bool transpose_b = false;
  TensorView out;
  TensorView bias;  // optional [out.cols]
  float beta = 0;   // 1 adds to what out holds
  // Which GEMM runs it: the index into cuBLASLt's heuristic list for this shape (out of range:
  // 0), or kOwnGemm for kjit's Hopper GEMM where it applies (cuBLASLt's first choice elsewhere).
  int algo = 0;
};
inline constexpr int kOwnGemm = -1;

// out[m, n] = op(a)[m, k] · op(b)[k, n].
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};
// The product's shape, or InvalidArgument naming the view whose shape or dtype does not fit.
absl::StatusOr<GemmShape> ShapeOf(const GemmArgs& g);

}  // namespace kjit::ops
