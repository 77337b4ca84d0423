#include "ops/common/tuning/compare.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kjit::ops {

namespace {

// "NaN" whatever its sign bit (fmt writes "-nan"), else as fmt writes it ("inf", "-0.5").
std::string ValueText(double v) { return std::isnan(v) ? "NaN" : fmt::format("{}", v); }

}  // namespace

std::string CompareResult::Describe(const std::string& name) const {
  if (ok)
    return fmt::format("{}: {} elements ok (worst {:.3g} of tolerance)", name, checked,
                       worst_ratio);
  // The ratio is over finite elements only: it says nothing of a NaN.
  std::string how;
  if (nonfinite > 0) {
    how = fmt::format("; {} NaN or infinite where the reference is not (or the other way)",
                      nonfinite);
  }
  if (mismatches > nonfinite) {
    how += fmt::format("; worst {:.3g}x tolerance among the finite", worst_ratio);
  }
  return fmt::format("{}: {} of {} elements out of tolerance; first at {}: got {} expected {}{}",
                     name, mismatches, checked, first_bad, ValueText(out_at_first),
                     ValueText(ref_at_first), how);
}

void CompareResult::Merge(const CompareResult& part, int64_t offset) {
  if (part.mismatches > 0 && mismatches == 0) {
    first_bad = part.first_bad + offset;
    out_at_first = part.out_at_first;
    ref_at_first = part.ref_at_first;
  }
  ok = ok && part.ok;
  checked += part.checked;
  mismatches += part.mismatches;
  nonfinite += part.nonfinite;
  worst_ratio = std::max(worst_ratio, part.worst_ratio);
}

CompareResult Compare(std::span<const double> out, std::span<const double> ref,
                      const Tolerance& tol, std::span<const double> atol_per_element) {
  CompareResult r;
  if (out.size() != ref.size()) {
    r.ok = false;
    r.mismatches = 1;
    return r;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    ++r.checked;
    const double o = out[i], e = ref[i];
    bool good;
    if (!std::isfinite(e) || !std::isfinite(o)) {
      good = std::isnan(e) ? std::isnan(o) : o == e;
      r.nonfinite += good ? 0 : 1;
    } else {
      const double atol = tol.atol + (atol_per_element.empty() ? 0.0 : atol_per_element[i]);
      const double allowed = atol + tol.rtol * std::fabs(e);
      const double err = std::fabs(o - e);
      const double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0);
      if (ratio > r.worst_ratio) r.worst_ratio = ratio;
      good = err <= allowed;
    }
    if (!good) {
      if (r.mismatches == 0) {
        r.first_bad = static_cast<int64_t>(i);
        r.out_at_first = o;
        r.ref_at_first = e;
      }
      ++r.mismatches;
      r.ok = false;
    }
  }
  return r;
}

double MaxAbs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

CompareResult CompareGemmResult(const std::vector<double>& got, const std::vector<double>& want,
                                DType dtype) {
  double sq = 0;
  for (double x : want) sq += x * x;
  const double rms = std::sqrt(sq / static_cast<double>(std::max<size_t>(want.size(), 1)));
  return Compare(got, want, {.rtol = 4 * RoundingRtol(dtype), .atol = rms * 0x1p-8});
}

double RoundingRtol(DType dtype) {
  switch (dtype) {
    case DType::kF32: return std::ldexp(1.0, -24);
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
  }
  return 0;
}

double RoundingAtol(DType dtype) {
  switch (dtype) {
    case DType::kF32: return std::ldexp(1.0, -150);
    case DType::kF16: return std::ldexp(1.0, -25);
    case DType::kBF16: return std::ldexp(1.0, -134);
  }
  return 0;
}

}  // namespace kjit::ops
