// Elementwise comparison of a kernel's output with an fp64 reference:
// |out - ref| <= atol + rtol * |ref|, NaN only where the reference is NaN and infinities exactly.
// Callers tie atol to the size of the values (e.g. a fraction of the largest |ref| or of the terms
// summed), never a constant that an all-zero output would pass.
//
//   CompareResult r = Compare(out, ref, {.rtol = 1.0 / 128, .atol = 1e-5 * MaxAbs(ref)});
//   if (!r.ok) fmt::print("{}\n", r.Describe("y"));
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "jit/dtype.h"

namespace kjit::ops {

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

struct CompareResult {
  bool ok = true;
  int64_t checked = 0;
  int64_t mismatches = 0;
  int64_t first_bad = -1;
  double out_at_first = 0;
  double ref_at_first = 0;
  double worst_ratio = 0;  // max |out-ref| / (atol + rtol|ref|) over finite elements
  int64_t nonfinite = 0;   // mismatches where out or ref is NaN or infinite
  std::string Describe(const std::string& name) const;
  // Adds the result of comparing the elements from `offset` on, as one comparison would have.
  void Merge(const CompareResult& part, int64_t offset);
};

// `atol_per_element`, when non-empty, is added to tol.atol element by element.
CompareResult Compare(std::span<const double> out, std::span<const double> ref,
                      const Tolerance& tol, std::span<const double> atol_per_element = {});
inline CompareResult Compare(const std::vector<double>& out, const std::vector<double>& ref,
                             const Tolerance& tol,
                             const std::vector<double>& atol_per_element = {}) {
  return Compare(std::span<const double>(out), std::span<const double>(ref), tol,
                 std::span<const double>(atol_per_element));
}

double MaxAbs(const std::vector<double>& v);  // over finite values

// One path's GEMM output (or a gradient made from one) against another path's over the same
// inputs, fp32 sums in another order: 4 roundings of the dtype relative, plus 2^-8 of the
// reference's RMS. A tensor 5% off everywhere fails it.
CompareResult CompareGemmResult(const std::vector<double>& got, const std::vector<double>& want,
                                DType dtype);

// What one rounding to the dtype may add: half an ulp relative to the value (RoundingRtol), but at
// least half the smallest subnormal in absolute terms (RoundingAtol; fp16's is 2^-25, which
// matters for gradients of 1e-5).
double RoundingRtol(DType dtype);
double RoundingAtol(DType dtype);

}  // namespace kjit::ops
