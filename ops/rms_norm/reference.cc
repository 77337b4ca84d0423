#include "ops/rms_norm/reference.h"

#include <algorithm>
#include <cmath>

#include "kjit/host_convert.h"

namespace kjit::ops {

RmsNormForwardResult RmsNormForwardReference(const RmsNormMath& m, int64_t rows,
                                             const std::vector<double>& x,
                                             const std::vector<double>* residual,
                                             const std::vector<double>& w) {
  const int64_t H = m.hidden;
  RmsNormForwardResult r;
  r.y.resize(rows * H);
  r.rstd.resize(rows);
  if (residual != nullptr) r.residual_out.resize(rows * H);
  std::vector<double> h(H);
  for (int64_t i = 0; i < rows; ++i) {
    double sumsq = 0;
    for (int64_t c = 0; c < H; ++c) {
      double v = x[i * H + c];
      if (residual != nullptr) {
        v = RoundTo(v + (*residual)[i * H + c], m.dtype);
        r.residual_out[i * H + c] = v;
      }
      h[c] = v;
      sumsq += v * v;
    }
    const double rstd = 1.0 / std::sqrt(sumsq / H + m.eps);
    r.rstd[i] = rstd;
    for (int64_t c = 0; c < H; ++c) {
      double n = h[c] * rstd;
      if (!m.gemma_cast) n = RoundTo(n, m.dtype);
      r.y[i * H + c] = n * (m.weight_offset + w[c]);
    }
  }
  return r;
}

RmsNormBackwardResult RmsNormBackwardReference(const RmsNormMath& m, int64_t rows,
                                               const std::vector<double>& dy,
                                               const std::vector<double>& x,
                                               const std::vector<double>& w,
                                               const std::vector<double>* dresidual) {
  const int64_t H = m.hidden;
  RmsNormBackwardResult r;
  r.dx.resize(rows * H);
  r.dw.assign(H, 0.0);
  r.dw_abs.assign(H, 0.0);
  r.dx_scale.resize(rows * H);
  for (int64_t i = 0; i < rows; ++i) {
    double sumsq = 0;
    for (int64_t c = 0; c < H; ++c) sumsq += x[i * H + c] * x[i * H + c];
    const double rstd = 1.0 / std::sqrt(sumsq / H + m.eps);
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

RmsNormTolerances RmsNormTolerancesFor(DType dtype, DType weight_dtype, bool gemma_cast) {
  const double r = RoundingRtol(dtype), a = RoundingAtol(dtype);
  RmsNormTolerances t;
  t.y = {(gemma_cast ? 1 : 3) * r + 1e-5, (gemma_cast ? 1 : 3) * a};
  t.rstd = {1e-5, 0};
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
  const RmsNormTolerances tol = RmsNormTolerancesFor(m.dtype, weight_dtype, m.gemma_cast);
  std::vector<std::pair<std::string, CompareResult>> results;
  if (out.y)
    results.emplace_back("y", Compare(*out.y, fwd.y, tol.y, RmsNormYAtol(m, rows, fwd.y, tol)));
  if (out.rstd) results.emplace_back("rstd", Compare(*out.rstd, fwd.rstd, tol.rstd));
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
