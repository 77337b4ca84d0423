#include "ops/log_probs/tuning/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kjit::ops {

LogProbsResult LogProbsReference(const LogProbsSpec& spec, int64_t rows,
                                 const std::vector<double>& logits,
                                 const std::vector<int64_t>& targets,
                                 const std::vector<double>* grad_logprob,
                                 const std::vector<double>* grad_entropy) {
  const int64_t v = spec.vocab;
  const double t = spec.temperature;
  const bool with_grad = grad_logprob != nullptr || grad_entropy != nullptr;
  LogProbsResult r;
  r.logprob.assign(rows, 0.0);
  r.entropy.assign(rows, 0.0);
  r.lse.assign(rows, 0.0);
  if (with_grad) r.grad.assign(rows * v, 0.0);
  std::vector<double> x(v);
  for (int64_t i = 0; i < rows; ++i) {
    const double* z = &logits[i * v];
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < v; ++j) {
      x[j] = z[j] / t;
      m = std::max(m, x[j]);
    }
    double s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[j] - m);
    const double lse = m + std::log(s);
    // H = -sum p (x - lse); classes of probability 0 add nothing.
    double h = 0;
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(x[j] - lse);
      if (p > 0) h -= p * (x[j] - lse);
    }
    r.lse[i] = lse;
    const int64_t target = targets[i];
    const bool valid = target != spec.ignore_index && target >= 0 && target < v;
    if (!valid) continue;
    r.logprob[i] = x[target] - lse;
    r.entropy[i] = h;
    if (!with_grad) continue;
    const double g_lp = grad_logprob != nullptr ? (*grad_logprob)[i] : 0.0;
    const double g_h = grad_entropy != nullptr ? (*grad_entropy)[i] : 0.0;
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(x[j] - lse);
      double d = p > 0 ? -p * (g_lp + g_h * ((x[j] - lse) + h)) : 0.0;
      if (j == target) d += g_lp;
      r.grad[i * v + j] = d / t;
    }
  }
  return r;
}

}  // namespace kjit::ops
