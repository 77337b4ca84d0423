#include "autotune/rms_norm_reference.h"

#include <cmath>

#include "autotune/host_convert.h"

namespace kjit::autotune {

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
  for (int64_t i = 0; i < rows; ++i) {
    double sumsq = 0;
    for (int64_t c = 0; c < H; ++c) sumsq += x[i * H + c] * x[i * H + c];
    const double rstd = 1.0 / std::sqrt(sumsq / H + m.eps);
    double dot = 0;
    for (int64_t c = 0; c < H; ++c) {
      dot += dy[i * H + c] * (m.weight_offset + w[c]) * x[i * H + c] * rstd;
    }
    const double mean_dot = dot / H;
    for (int64_t c = 0; c < H; ++c) {
      const double xhat = x[i * H + c] * rstd;
      const double g = dy[i * H + c] * (m.weight_offset + w[c]);
      double d = rstd * (g - xhat * mean_dot);
      if (dresidual != nullptr) d += (*dresidual)[i * H + c];
      r.dx[i * H + c] = d;
      r.dw[c] += dy[i * H + c] * xhat;
      r.dw_abs[c] += std::fabs(dy[i * H + c] * xhat);
    }
  }
  return r;
}

}  // namespace kjit::autotune
