#include "ops/cross_entropy/tuning/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "ops/common/parallel.h"

namespace kjit::ops {

namespace {

bool IsValid(const CrossEntropyMath& m, int64_t t) {
  return t != m.loss.ignore_index && t >= 0 && t < m.vocab;
}

}  // namespace

CrossEntropyResult CrossEntropyReference(const CrossEntropyMath& m, int64_t rows,
                                         const std::vector<double>& logits,
                                         const std::vector<int64_t>& targets,
                                         const std::vector<double>* grad_output, bool with_grad) {
  const int64_t V = m.vocab;
  const double eps = m.loss.label_smoothing, z = m.loss.z_loss, cap = m.loss.softcap;
  CrossEntropyResult r;
  r.row_loss.assign(rows, 0.0);
  r.lse.resize(rows);
  r.argmax.resize(rows);
  r.entropy.resize(rows);
  r.entropy_atol.resize(rows);
  r.target_logprob.assign(rows, 0.0);
  r.target_logprob_atol.assign(rows, 0.0);
  r.row_scale.assign(rows, 0.0);
  std::vector<double> row_terms(rows, 0.0);
  if (with_grad) {
    r.grad.resize(rows * V);
    r.grad_terms.resize(rows * V);
  }

  const bool weighted = !m.class_weight.empty();
  auto weight = [&](int64_t c) { return weighted ? m.class_weight[c] : 1.0; };
  double weight_total = 0, weight_abs_total = 0;  // sum_j w_j and sum_j |w_j|
  for (int64_t j = 0; j < V; ++j) {
    weight_total += weight(j);
    weight_abs_total += std::fabs(weight(j));
  }
  int64_t valid = 0, bad = 0;
  double divisor = 0;  // the mean's: valid rows, or their target weights summed
  for (int64_t i = 0; i < rows; ++i) {
    if (IsValid(m, targets[i])) {
      ++valid;
      divisor += weight(targets[i]);
    } else if (targets[i] != m.loss.ignore_index) {
      ++bad;
    }
  }
  r.counters = {static_cast<double>(valid), static_cast<double>(bad)};
  auto capped = [&](double x) { return cap > 0 ? cap * std::tanh(x / cap) : x; };

  // Rows are independent: a 2^25-element case takes a fraction of a second.
  ForEachIndex(rows, V, [&](int64_t i) {
    const double* x = &logits[i * V];
    // argmax over the raw logits: the first maximum, a NaN beating any number (torch.argmax).
    int64_t best = 0;
    for (int64_t j = 1; j < V; ++j) {
      const bool jn = std::isnan(x[j]), bn = std::isnan(x[best]);
      if ((jn && !bn) || (!jn && !bn && x[j] > x[best])) best = j;
    }
    r.argmax[i] = static_cast<double>(best);

    // lse = max + log sum exp(x - max): NaN when any logit is NaN or +Inf (Inf - Inf), -Inf when
    // all are -Inf, as the kernel (and PyTorch's log_softmax) gives.
    bool nan = false;
    // sum_x: sum_j w_j x_j (w = 1 without class weights); sum_abs: of |w_j| (|lse| + |x_j|) less
    // the lse part, added below.
    double mx = -std::numeric_limits<double>::infinity(), sum_x = 0, sum_abs_x = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double c = capped(x[j]);
      if (std::isnan(c))
        nan = true;
      else
        mx = std::max(mx, c);
      sum_x += weight(j) * c;
      sum_abs_x += std::fabs(weight(j) * c);
    }
    double lse;
    // The entropy, NaN wherever the lse is not finite: -sum p ln p = lse - sum p x over the
    // classes with p > 0. The kernel sums 2^y y with y = (x - max) log2e in fp32: its error is
    // relative to 1 + H + sum p |x - max| (entropy_atol).
    double entropy = std::numeric_limits<double>::quiet_NaN(), spread = 0;
    if (nan || mx == std::numeric_limits<double>::infinity()) {
      lse = std::numeric_limits<double>::quiet_NaN();
    } else if (mx == -std::numeric_limits<double>::infinity()) {
      lse = mx;
    } else {
      double s = 0;
      for (int64_t j = 0; j < V; ++j) s += std::exp(capped(x[j]) - mx);
      lse = mx + std::log(s);
      double plogp = 0;
      for (int64_t j = 0; j < V; ++j) {
        const double c = capped(x[j]), p = std::exp(c - lse);
        if (p > 0) {
          plogp += p * (c - lse);
          spread += p * (mx - c);
        }
      }
      entropy = -plogp;
    }
    r.lse[i] = lse;
    r.entropy[i] = entropy;
    r.entropy_atol[i] =
        std::isnan(entropy) ? 0.0 : 2e-5 * (1 + entropy + spread + std::log(double(V)) / 16);

    const int64_t t = targets[i];
    if (!IsValid(m, t)) {
      if (with_grad) {
        std::fill_n(&r.grad[i * V], V, 0.0);
        std::fill_n(&r.grad_terms[i * V], V, 0.0);
      }
      return;
    }
    const double xt = capped(x[t]);
    const double wt = weight(t);
    r.target_logprob[i] = xt - lse;
    r.target_logprob_atol[i] = 1e-5 * (1 + std::fabs(lse) + std::fabs(xt));
    // The same form as the kernel, so that infinities give the same results; terms that are off
    // are left out rather than multiplied by 0 (0 * Inf).
    double loss;
    if (weighted) {
      loss = eps > 0 ? (1 - eps) * wt * (lse - xt) + eps / V * (weight_total * lse - sum_x)
                     : wt * (lse - xt);
      if (z > 0) loss += z * wt * lse * lse;
    } else {
      loss = eps > 0 ? lse - (1 - eps) * xt - eps * (sum_x / V) : lse - xt;
      if (z > 0) loss += z * lse * lse;
    }
    r.row_loss[i] = loss;
    // Options that are off add nothing (0 * Inf would make the tolerance NaN for a row holding
    // -Inf logits, as masked vocabularies do).
    row_terms[i] = std::fabs(wt) * (1 + std::fabs(lse) + std::fabs(xt));
    if (eps > 0) row_terms[i] += eps * (sum_abs_x + weight_abs_total * std::fabs(lse)) / V;
    if (z > 0) row_terms[i] += std::fabs(wt) * z * lse * lse;

    if (!with_grad) return;
    double g = 1;
    if (grad_output != nullptr) g = (*grad_output)[m.loss.reduction == Reduction::kNone ? i : 0];
    if (m.loss.reduction == Reduction::kMean) g /= divisor;
    // p's factor A + 2 z w_t lse (Gradient in the template), and its size.
    const double a = eps > 0 ? (1 - eps) * wt + eps * weight_total / V : wt;
    const double a_abs =
        eps > 0 ? (1 - eps) * std::fabs(wt) + eps * weight_abs_total / V : std::fabs(wt);
    const double c1 = a + 2 * z * wt * lse, c1_abs = a_abs + 2 * z * std::fabs(wt * lse);
    r.row_scale[i] = std::fabs(g) * c1_abs;
    for (int64_t j = 0; j < V; ++j) {
      const double u = cap > 0 ? x[j] / cap : 0;
      // 1 - tanh^2(u), written without cancellation (as the kernel computes it).
      const double e = std::exp(-2 * std::fabs(u));
      const double slope = cap > 0 ? 4 * e / ((1 + e) * (1 + e)) : 1.0;
      const double p = std::exp(capped(x[j]) - lse);
      // (Terms that are off are left out: 0 * a NaN weight is NaN, and the kernel omits them.)
      const double smooth = eps > 0 ? eps * weight(j) / V : 0, hit = j == t ? (1 - eps) * wt : 0;
      double d = p * c1 - smooth - hit;
      r.grad[i * V + j] = g * d * slope;
      r.grad_terms[i * V + j] =
          std::fabs(g) * slope * (p * c1_abs + std::fabs(smooth) + std::fabs(hit));
    }
  });

  double total = 0, total_terms = 0;
  for (int64_t i = 0; i < rows; ++i) {
    total += r.row_loss[i];
    total_terms += row_terms[i];
  }
  switch (m.loss.reduction) {
    case Reduction::kNone:
      r.loss = r.row_loss;
      r.loss_terms = row_terms;
      break;
    case Reduction::kSum:
      r.loss = {total};
      r.loss_terms = {total_terms};
      break;
    case Reduction::kMean:  // 0 / 0 = NaN with every row ignored (or weighing 0), as PyTorch gives
      r.loss = {total / divisor};
      r.loss_terms = {divisor != 0 ? total_terms / std::fabs(divisor) : 0.0};
      break;
  }
  return r;
}

CrossEntropyTolerances CrossEntropyTolerancesFor(DType dtype) {
  CrossEntropyTolerances t;
  // The kernels' exponentials flush results below 2^-126 (fp32's smallest normal) to zero, which
  // fp32 and bf16 could otherwise hold as subnormals: at most that much absolute error.
  t.grad = {RoundingRtol(dtype) + 1e-6, std::max(RoundingAtol(dtype), std::ldexp(1.0, -126))};
  return t;
}

namespace {

// The gradient's per-element atol of reference row `row`, into `atol` ([vocab]).
void GradAtolOfRow(const CrossEntropyMath& m, const CrossEntropyResult& ref,
                   const CrossEntropyTolerances& tol, int64_t row, std::span<double> atol) {
  const double floor = tol.grad_atol_per_row_scale * ref.row_scale[row];
  const double* terms = ref.grad_terms.data() + row * m.vocab;
  for (int64_t j = 0; j < m.vocab; ++j) atol[j] = tol.grad_atol_per_terms * terms[j] + floor;
}

}  // namespace

std::vector<double> CrossEntropyGradAtol(const CrossEntropyMath& m, const CrossEntropyResult& ref,
                                         const CrossEntropyTolerances& tol) {
  std::vector<double> atol(ref.grad_terms.size());
  for (size_t row = 0; row < ref.row_scale.size(); ++row) {
    GradAtolOfRow(m, ref, tol, row, std::span<double>(atol).subspan(row * m.vocab, m.vocab));
  }
  return atol;
}

CompareResult CheckCrossEntropyGradRows(const CrossEntropyMath& m, const CrossEntropyResult& ref,
                                        int64_t first, std::span<const double> grad) {
  const CrossEntropyTolerances tol = CrossEntropyTolerancesFor(m.dtype);
  const int64_t rows = static_cast<int64_t>(grad.size()) / m.vocab;
  CompareResult result;
  if (static_cast<int64_t>(grad.size()) != rows * m.vocab ||
      (first + rows) * m.vocab > static_cast<int64_t>(ref.grad.size())) {
    result.ok = false;  // not whole rows of the reference: as Compare reports a size mismatch
    result.mismatches = 1;
    return result;
  }
  // Row by row: a row's atol, output and reference stay in cache, and nothing of the size of
  // every checked row is allocated (64 rows of 128K are 64 MB a vector).
  std::vector<double> atol(m.vocab);
  for (int64_t r = 0; r < rows; ++r) {
    GradAtolOfRow(m, ref, tol, first + r, atol);
    result.Merge(Compare(grad.subspan(r * m.vocab, m.vocab),
                         std::span<const double>(ref.grad).subspan((first + r) * m.vocab, m.vocab),
                         tol.grad, atol),
                 r * m.vocab);
  }
  return result;
}

std::vector<std::pair<std::string, CompareResult>> CheckCrossEntropy(
    const CrossEntropyMath& m, const CrossEntropyOutputs& out, const CrossEntropyResult& ref) {
  const CrossEntropyTolerances tol = CrossEntropyTolerancesFor(m.dtype);
  std::vector<std::pair<std::string, CompareResult>> results;
  if (out.loss) {
    std::vector<double> atol(ref.loss_terms.size());
    for (size_t k = 0; k < atol.size(); ++k) atol[k] = tol.loss_atol_per_terms * ref.loss_terms[k];
    results.emplace_back("loss", Compare(*out.loss, ref.loss, tol.loss, atol));
  }
  if (out.lse) results.emplace_back("lse", Compare(*out.lse, ref.lse, tol.lse));
  if (out.argmax) results.emplace_back("argmax", Compare(*out.argmax, ref.argmax, {0, 0}));
  if (out.entropy) {
    results.emplace_back("entropy",
                         Compare(*out.entropy, ref.entropy, {1e-5, 0}, ref.entropy_atol));
  }
  if (out.target_logprob) {
    results.emplace_back("target_logprob", Compare(*out.target_logprob, ref.target_logprob,
                                                   {1e-6, 0}, ref.target_logprob_atol));
  }
  if (out.counters) results.emplace_back("counters", Compare(*out.counters, ref.counters, {0, 0}));
  if (out.grad) results.emplace_back("grad", CheckCrossEntropyGradRows(m, ref, 0, *out.grad));
  return results;
}

}  // namespace kjit::ops
