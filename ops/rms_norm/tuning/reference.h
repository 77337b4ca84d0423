// The fp64 CPU reference of RMSNorm forward and backward, next to the kernels it checks (the tests,
// the benchmark's pre-timing check and the autotuner's candidate check all use it).
//
// Inputs are the values the device holds (already rounded to their dtype). The reference rounds
// where the kernel's definition rounds (kjit/rms_norm.h: the fused residual sum, llama casting's
// normalized x, every intermediate of casting none) and nowhere else, so the remaining difference
// is the kernel's fp32 arithmetic and its final store.
//
// Casting none rounds rstd itself, so an fp32 sum of x^2 that lands within its rounding error of a
// tie may round the other way than the exact sum does: one unit in the last place of the dtype,
// which the rest of the row then carries. The reference therefore gives the range of rstd values a
// correct kernel can produce (rstd_lo..rstd_hi) and takes the kernel's rstd, once checked to lie in
// it, to compute y and the backward with, so that everything else is compared tightly:
//
//   RmsNormMath m{.hidden = 4096, .dtype = DType::kBF16, .casting = RmsNormCasting::kNone};
//   auto fwd = RmsNormForwardReference(m, rows, x, /*residual=*/nullptr, w, &kernel_rstd);
//   auto bwd = RmsNormBackwardReference(m, rows, dy, x, w, nullptr, &kernel_rstd);
//   for (auto& [name, r] : CheckRmsNorm(m, rows, DType::kBF16, outputs, fwd, &bwd)) ...
#pragma once

#include <cstdint>
#include <vector>

#include <string>
#include <utility>

#include "jit/dtype.h"
#include "kjit/rms_norm.h"
#include "ops/common/tuning/compare.h"

namespace kjit::ops {

struct RmsNormMath {
  int64_t hidden = 0;
  DType dtype = DType::kBF16;
  double eps = 1e-6;
  double weight_offset = 0;
  RmsNormCasting casting = RmsNormCasting::kLlama;
};

struct RmsNormForwardResult {
  std::vector<double> y;     // [rows * hidden], before the final rounding
  std::vector<double> rstd;  // [rows], as the reference computes it
  // [rows]: the least and greatest rstd a correct kernel may give (casting none: values of the
  // dtype either side of rstd when the sum of x^2 or the rsqrt is near a tie); else rstd.
  std::vector<double> rstd_lo, rstd_hi;
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

// Contiguous [rows, hidden] arrays. `use_rstd` ([rows], optional): y is computed with these rstd
// values instead of the reference's own (which rstd, rstd_lo and rstd_hi still report); for casting
// none, the kernel's rstd, so that a rounding of the mean near a tie does not fail the row's y.
RmsNormForwardResult RmsNormForwardReference(const RmsNormMath& m, int64_t rows,
                                             const std::vector<double>& x,
                                             const std::vector<double>* residual,
                                             const std::vector<double>& w,
                                             const std::vector<double>* use_rstd = nullptr);

// `x` is what the forward normalized (residual_out when fused). `rstd` ([rows], optional): the
// saved rstd the backward is given (the kernel's, for casting none); else computed as the forward
// defines it.
RmsNormBackwardResult RmsNormBackwardReference(const RmsNormMath& m, int64_t rows,
                                               const std::vector<double>& dy,
                                               const std::vector<double>& x,
                                               const std::vector<double>& w,
                                               const std::vector<double>* dresidual,
                                               const std::vector<double>* rstd = nullptr);

// What a kernel's outputs may differ from the reference by, per output. y: half an ulp at the
// store, plus (llama casting) one ulp of the normalized value when fp32 and fp64 round a tie apart
// (casting none: the store alone, its products being exact in fp32); rstd: fp32 arithmetic (casting
// none: the range rstd_lo..rstd_hi, and a value of the dtype); dx and dw: fp32 arithmetic relative
// to the terms they sum, plus the store.
struct RmsNormTolerances {
  Tolerance y, rstd, residual_out, dx, dw;
  double y_atol_per_row_max = 1e-6;  // atol = this * max |y| of the row
  double dx_atol_per_scale = 1e-5;   // atol = this * dx_scale
  double dw_atol_per_abs = 5e-5;     // atol = this * dw_abs
};
RmsNormTolerances RmsNormTolerancesFor(DType dtype, DType weight_dtype, RmsNormCasting casting);

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
