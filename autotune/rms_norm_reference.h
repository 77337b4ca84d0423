// The fp64 CPU reference of RMSNorm forward and backward, next to the kernels it checks (the tests,
// the benchmark's pre-timing check and the autotuner's candidate check all use it).
//
// Inputs are the values the device holds (already rounded to their dtype). The reference rounds
// where the kernel's definition rounds (the fused residual sum, llama casting's normalized x) and
// nowhere else, so the remaining difference is the kernel's fp32 arithmetic and its final store.
//
//   RmsNormReference ref({.hidden = 4096, .dtype = DType::kBF16, .eps = 1e-6}, rows);
//   auto fwd = ref.Forward(x, w, /*residual=*/nullptr);
#pragma once

#include <cstdint>
#include <vector>

#include "jit/dtype.h"

namespace kjit::autotune {

struct RmsNormMath {
  int64_t hidden = 0;
  DType dtype = DType::kBF16;
  double eps = 1e-6;
  double weight_offset = 0;
  bool gemma_cast = false;
};

struct RmsNormForwardResult {
  std::vector<double> y;             // [rows * hidden], before the final rounding
  std::vector<double> rstd;          // [rows]
  std::vector<double> residual_out;  // [rows * hidden] when a residual was given (rounded)
};

struct RmsNormBackwardResult {
  std::vector<double> dx;      // [rows * hidden]
  std::vector<double> dw;      // [hidden]
  std::vector<double> dw_abs;  // [hidden]: sum of |dy * xhat|, the scale of dw's rounding error
};

// Contiguous [rows, hidden] arrays.
RmsNormForwardResult RmsNormForwardReference(const RmsNormMath& m, int64_t rows,
                                             const std::vector<double>& x,
                                             const std::vector<double>* residual,
                                             const std::vector<double>& w);

// `x` is what the forward normalized (residual_out when fused).
RmsNormBackwardResult RmsNormBackwardReference(const RmsNormMath& m, int64_t rows,
                                               const std::vector<double>& dy,
                                               const std::vector<double>& x,
                                               const std::vector<double>& w,
                                               const std::vector<double>* dresidual);

}  // namespace kjit::autotune
