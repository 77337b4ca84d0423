#include "ops/rms_norm/tuning/reference.h"

#include <algorithm>
#include <cmath>

#include "kjit/host_convert.h"

namespace kjit::ops {

namespace {

bool None(const RmsNormMath& m) { return m.casting == RmsNormCasting::kNone; }

// The sum of a row's squares, each rounded to the dtype first under casting none.
double SumOfSquares(const RmsNormMath& m, const double* h) {
  double sumsq = 0;
  for (int64_t c = 0; c < m.hidden; ++c)
    sumsq += None(m) ? RoundTo(h[c] * h[c], m.dtype) : h[c] * h[c];
  return sumsq;
}

// Casting none's rstd = round(rsqrt(round(round(sumsq / hidden) + eps))), the + eps in fp32 with
// the fp32 eps the kernel is given. The sum is scaled by `sum_factor` and the rsqrt by
// `rsqrt_factor` to find the extremes an fp32 sum and rsqrtf may reach.
double NoneRstd(const RmsNormMath& m, double sumsq, double sum_factor, double rsqrt_factor) {
  const double mean = RoundTo(sumsq * sum_factor / m.hidden, m.dtype);
  const double a = RoundTo(mean + static_cast<float>(m.eps), m.dtype);  // RoundTo passes fp32
  return RoundTo(rsqrt_factor / std::sqrt(a), m.dtype);
}

// The rstd the forward defines for a row whose sum of squares is `sumsq`.
double Rstd(const RmsNormMath& m, double sumsq) {
  return None(m) ? NoneRstd(m, sumsq, 1, 1) : 1.0 / std::sqrt(sumsq / m.hidden + m.eps);
}

}  // namespace

RmsNormForwardResult RmsNormForwardReference(const RmsNormMath& m, int64_t rows,
                                             const std::vector<double>& x,
                                             const std::vector<double>* residual,
                                             const std::vector<double>& w,
                                             const std::vector<double>* use_rstd) {
  const int64_t H = m.hidden;
  // An fp32 sum of H terms of one sign, in any order, and its division by H err by at most
  // (H + 1) units of fp32 rounding (2^-24) relative; rsqrtf by 2 ulps (2^-22); both with room.
  const double sum_err = (H + 2) * std::ldexp(1.0, -24), rsqrt_err = std::ldexp(1.0, -21);
  RmsNormForwardResult r;
  r.y.resize(rows * H);
  r.rstd.resize(rows);
  r.rstd_lo.resize(rows);
  r.rstd_hi.resize(rows);
  if (residual != nullptr) r.residual_out.resize(rows * H);
  std::vector<double> h(H);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < H; ++c) {
      double v = x[i * H + c];
      if (residual != nullptr) {
        v = RoundTo(v + (*residual)[i * H + c], m.dtype);
        r.residual_out[i * H + c] = v;
      }
      h[c] = v;
    }
    const double sumsq = SumOfSquares(m, h.data());
    r.rstd[i] = r.rstd_lo[i] = r.rstd_hi[i] = Rstd(m, sumsq);
    if (None(m)) {
      r.rstd_lo[i] = NoneRstd(m, sumsq, 1 + sum_err, 1 - rsqrt_err);
      r.rstd_hi[i] = NoneRstd(m, sumsq, 1 - sum_err, 1 + rsqrt_err);
    }
    const double rstd = use_rstd != nullptr ? (*use_rstd)[i] : r.rstd[i];
    for (int64_t c = 0; c < H; ++c) {
      double n = h[c] * rstd;
      if (m.casting != RmsNormCasting::kGemma) n = RoundTo(n, m.dtype);
      double scale = m.weight_offset + w[c];
      if (None(m)) scale = RoundTo(scale, m.dtype);
      r.y[i * H + c] = n * scale;
    }
  }
  return r;
}

RmsNormBackwardResult RmsNormBackwardReference(const RmsNormMath& m, int64_t rows,
                                               const std::vector<double>& dy,
                                               const std::vector<double>& x,
                                               const std::vector<double>& w,
                                               const std::vector<double>* dresidual,
                                               const std::vector<double>* given_rstd) {
  const int64_t H = m.hidden;
  RmsNormBackwardResult r;
  r.dx.resize(rows * H);
  r.dw.assign(H, 0.0);
  r.dw_abs.assign(H, 0.0);
  r.dx_scale.resize(rows * H);
  for (int64_t i = 0; i < rows; ++i) {
    const double rstd =
        given_rstd != nullptr ? (*given_rstd)[i] : Rstd(m, SumOfSquares(m, &x[i * H]));
    double dot = 0, dot_abs = 0;
    for (int64_t c = 0; c < H; ++c) {
      const double term = dy[i * H + c] * (m.weight_offset + w[c]) * x[i * H + c] * rstd;
      dot += term;
      dot_abs += std::fabs(term);
    }
    const double mean_dot = dot / H;
    const double mean_abs = dot_abs / H;  // what the kernel's fp32 sum errs relative to
    for (int64_t c = 0; c < H; ++c) {
      const double xhat = x[i * H + c] * rstd;
      const double g = dy[i * H + c] * (m.weight_offset + w[c]);
      double d = rstd * (g - xhat * mean_dot);
      double scale = rstd * (std::fabs(g) + std::fabs(xhat) * mean_abs);
      if (dresidual != nullptr) {
        d += (*dresidual)[i * H + c];
        scale += std::fabs((*dresidual)[i * H + c]);
      }
      r.dx[i * H + c] = d;
      r.dx_scale[i * H + c] = scale;
      r.dw[c] += dy[i * H + c] * xhat;
      r.dw_abs[c] += std::fabs(dy[i * H + c] * xhat);
    }
  }
  return r;
}

RmsNormTolerances RmsNormTolerancesFor(DType dtype, DType weight_dtype, RmsNormCasting casting) {
  const double r = RoundingRtol(dtype), a = RoundingAtol(dtype);
  RmsNormTolerances t;
  switch (casting) {
    case RmsNormCasting::kLlama: t.y = {3 * r + 1e-5, 3 * a}; break;
    case RmsNormCasting::kGemma: t.y = {r + 1e-5, a}; break;
    // Given the kernel's rstd, n and the weight product are exact in fp32: the store alone.
    case RmsNormCasting::kNone: t.y = {r, a}; break;
  }
  // Casting none: within rstd_lo..rstd_hi (CheckRmsNorm), nothing more.
  t.rstd = {casting == RmsNormCasting::kNone ? 0 : 1e-5, 0};
  t.residual_out = {r, a};
  t.dx = {r + 1e-5, a};
  t.dw = {RoundingRtol(weight_dtype) + 1e-5, RoundingAtol(weight_dtype)};
  return t;
}

std::vector<double> RmsNormYAtol(const RmsNormMath& m, int64_t rows,
                                 const std::vector<double>& y_ref, const RmsNormTolerances& tol) {
  const int64_t H = m.hidden;
  std::vector<double> atol(y_ref.size());
  for (int64_t i = 0; i < rows; ++i) {
    double row_max = 0;
    for (int64_t c = 0; c < H; ++c) {
      const double v = y_ref[i * H + c];
      if (std::isfinite(v)) row_max = std::max(row_max, std::fabs(v));
    }
    for (int64_t c = 0; c < H; ++c) atol[i * H + c] = tol.y_atol_per_row_max * row_max;
  }
  return atol;
}

std::vector<std::pair<std::string, CompareResult>> CheckRmsNorm(const RmsNormMath& m, int64_t rows,
                                                                DType weight_dtype,
                                                                const RmsNormOutputs& out,
                                                                const RmsNormForwardResult& fwd,
                                                                const RmsNormBackwardResult* bwd) {
  const RmsNormTolerances tol = RmsNormTolerancesFor(m.dtype, weight_dtype, m.casting);
  std::vector<std::pair<std::string, CompareResult>> results;
  if (out.y)
    results.emplace_back("y", Compare(*out.y, fwd.y, tol.y, RmsNormYAtol(m, rows, fwd.y, tol)));
  if (out.rstd && None(m)) {
    // Anywhere in rstd_lo..rstd_hi (the middle, give or take half the width), and in the dtype.
    std::vector<double> middle(rows), half_width(rows, 0.0), in_dtype(rows);
    for (int64_t i = 0; i < rows; ++i) {
      const double lo = fwd.rstd_lo[i], hi = fwd.rstd_hi[i];
      const bool point = lo == hi || !std::isfinite(hi - lo);  // NaN and infinite rows too
      middle[i] = point ? lo : lo + (hi - lo) / 2;
      if (!point) half_width[i] = (hi - lo) / 2;
      in_dtype[i] = RoundTo((*out.rstd)[i], m.dtype);
    }
    results.emplace_back("rstd", Compare(*out.rstd, middle, tol.rstd, half_width));
    results.emplace_back("rstd in the dtype", Compare(*out.rstd, in_dtype, {}));
  } else if (out.rstd) {
    results.emplace_back("rstd", Compare(*out.rstd, fwd.rstd, tol.rstd));
  }
  if (out.residual_out) {
    results.emplace_back("residual_out",
                         Compare(*out.residual_out, fwd.residual_out, tol.residual_out));
  }
  if (bwd != nullptr && out.dx) {
    std::vector<double> atol(bwd->dx_scale.size());
    for (size_t i = 0; i < atol.size(); ++i) atol[i] = tol.dx_atol_per_scale * bwd->dx_scale[i];
    results.emplace_back("dx", Compare(*out.dx, bwd->dx, tol.dx, atol));
  }
  if (bwd != nullptr && out.dw) {
    std::vector<double> atol(bwd->dw_abs.size());
    for (size_t i = 0; i < atol.size(); ++i) atol[i] = tol.dw_atol_per_abs * bwd->dw_abs[i];
    results.emplace_back("dw", Compare(*out.dw, bwd->dw, tol.dw, atol));
  }
  return results;
}

}  // namespace kjit::ops
