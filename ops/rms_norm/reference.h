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

#include <string>
#include <utility>

#include "jit/dtype.h"
#include "ops/common/compare.h"

namespace kjit::ops {

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
  // [rows * hidden]: rstd * (|g| + |xhat| * mean|g * xhat|) (+ |dresidual|), the size of the terms
  // dx is the difference of. dx cancels (hidden = 1 gives dx near 0), so its error scales with
  // these, not with dx.
  std::vector<double> dx_scale;
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

// What a kernel's outputs may differ from the reference by, per output. y: half an ulp at the
// store, plus (llama casting) one ulp of the normalized value when fp32 and fp64 round a tie apart;
// dx and dw: fp32 arithmetic relative to the terms they sum, plus the store.
struct RmsNormTolerances {
  Tolerance y, rstd, residual_out, dx, dw;
  double y_atol_per_row_max = 1e-6;  // atol = this * max |y| of the row
  double dx_atol_per_scale = 1e-5;   // atol = this * dx_scale
  double dw_atol_per_abs = 5e-5;     // atol = this * dw_abs
};
RmsNormTolerances RmsNormTolerancesFor(DType dtype, DType weight_dtype, bool gemma_cast);

// The outputs a kernel produced (decoded to double); null ones are not checked.
struct RmsNormOutputs {
  const std::vector<double>* y = nullptr;
  const std::vector<double>* rstd = nullptr;
  const std::vector<double>* residual_out = nullptr;
  const std::vector<double>* dx = nullptr;
  const std::vector<double>* dw = nullptr;
};

// Compares every given output with the references; one (name, result) per output checked.
std::vector<std::pair<std::string, CompareResult>> CheckRmsNorm(const RmsNormMath& m, int64_t rows,
                                                                DType weight_dtype,
                                                                const RmsNormOutputs& out,
                                                                const RmsNormForwardResult& fwd,
                                                                const RmsNormBackwardResult* bwd);

// The per-element atol CheckRmsNorm uses for y.
std::vector<double> RmsNormYAtol(const RmsNormMath& m, int64_t rows,
                                 const std::vector<double>& y_ref, const RmsNormTolerances& tol);

}  // namespace kjit::ops
