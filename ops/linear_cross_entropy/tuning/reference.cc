#include "ops/linear_cross_entropy/tuning/reference.h"

#include "kjit/host_convert.h"
#include "ops/common/parallel.h"

#include <algorithm>
#include <cmath>

namespace kjit::ops {

namespace {

constexpr double kFp32Unit = 0x1p-24;

}  // namespace

LinearCrossEntropyResult LinearCrossEntropyReference(const LinearCrossEntropySpec& s,
                                                     const LinearCrossEntropyProblem& p,
                                                     int64_t chunks) {
  const int64_t R = p.rows, V = p.vocab, H = p.hidden;
  const bool has_bias = !p.bias.empty();
  // The device's logits are fp32 sums rounded to the dtype: the reference rounds the exact sums
  // the same way, and a logit may differ from that only where the sum's fp32 error can reach
  // across a rounding boundary (then by that boundary's step; for fp32 logits by the error).
  std::vector<double> logits(R * V), logit_error(R * V, 0.0);
  ForEachIndex(R, V * H, [&](int64_t r) {
    for (int64_t v = 0; v < V; ++v) {
      double sum = has_bias ? p.bias[v] : 0.0, magnitude = has_bias ? std::fabs(p.bias[v]) : 0.0;
      for (int64_t k = 0; k < H; ++k) {
        const double t = p.hidden_states[r * H + k] * p.weight[v * H + k];
        sum += t;
        magnitude += std::fabs(t);
      }
      const double nominal = RoundTo(sum, s.dtype), slack = (H + 1) * kFp32Unit * magnitude;
      logits[r * V + v] = nominal;
      double error = 0;
      for (double sign : {-1.0, 1.0}) {
        error = std::max(error, std::fabs(RoundTo(sum + sign * slack, s.dtype) - nominal));
        // cuBLASLt's bias epilogue is not always one rounding of product + bias (seen on the
        // H200); nor always two (product rounded first): either is allowed.
        if (has_bias) {
          const double product = sum - p.bias[v] + sign * slack;
          error = std::max(
              error, std::fabs(RoundTo(RoundTo(product, s.dtype) + p.bias[v], s.dtype) - nominal));
        }
      }
      logit_error[r * V + v] = error;
    }
  });

  const CrossEntropyMath m{
      .vocab = V, .dtype = s.dtype, .loss = s.loss, .class_weight = p.class_weight};
  LinearCrossEntropyResult out;
  out.loss = CrossEntropyReference(m, R, logits, p.targets,
                                   p.grad_output.empty() ? nullptr : &p.grad_output, true);
  const CrossEntropyResult& ce = out.loss;
  const CrossEntropyTolerances tol = CrossEntropyTolerancesFor(s.dtype);

  // What the logits' possible differences move: p_v by at most p_v (dx_v + sum_j p_j dx_j), lse
  // by at most sum_j p_j dx_j (row_shift), the soft-cap's slope by 2 dx_v / cap.
  std::vector<double> row_shift(R, 0.0), grad_error(R * V);
  const std::vector<double> ce_atol = CrossEntropyGradAtol(m, ce, tol);
  ForEachIndex(R, V, [&](int64_t r) {
    double shift = 0;
    for (int64_t v = 0; v < V; ++v) {
      double x = logits[r * V + v];
      if (s.loss.softcap > 0) x = s.loss.softcap * std::tanh(x / s.loss.softcap);
      shift += std::exp(x - ce.lse[r]) * logit_error[r * V + v];
    }
    row_shift[r] = shift;
    for (int64_t v = 0; v < V; ++v) {
      const int64_t i = r * V + v;
      const double dx = logit_error[i];
      grad_error[i] = tol.grad.rtol * std::fabs(ce.grad[i]) + tol.grad.atol + ce_atol[i] +
                      2 * (dx + shift) * ce.grad_terms[i] +
                      (s.loss.softcap > 0 ? 2 * dx / s.loss.softcap * std::fabs(ce.grad[i]) : 0.0);
    }
  });

  // The loss and lse: lse moves by at most the logits' error, the loss by twice it (lse - x_t)
  // times the z-loss factor.
  const double z = s.loss.z_loss;
  std::vector<double> row_bound(R, 0.0);
  int64_t valid = 0;
  for (int64_t r = 0; r < R; ++r) {
    const bool ok = p.targets[r] != s.loss.ignore_index && p.targets[r] >= 0 && p.targets[r] < V;
    valid += ok;
    if (ok) {
      row_bound[r] = 2 * (row_shift[r] + logit_error[r * V + p.targets[r]]) *
                     (1 + 2 * z * std::fabs(ce.lse[r]));
    }
  }
  const std::vector<double> lse_atol = [&] {
    std::vector<double> a(R);
    for (int64_t r = 0; r < R; ++r) {
      a[r] = 2 * row_shift[r] + tol.lse.atol + tol.lse.rtol * std::fabs(ce.lse[r]);
    }
    return a;
  }();
  out.lse_atol = lse_atol;
  // The entropy moves by at most 2 H max_j dx_j (dH = -sum_j p_j (ln p_j + H) dx_j); the target's
  // log-probability by its logit's error plus the lse's.
  out.entropy_atol.resize(R);
  out.target_logprob_atol.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    double worst = 0;
    for (int64_t v = 0; v < V; ++v) worst = std::max(worst, logit_error[r * V + v]);
    const double h = std::isnan(ce.entropy[r]) ? 0.0 : ce.entropy[r];
    out.entropy_atol[r] = ce.entropy_atol[r] + 2 * h * worst + 2 * row_shift[r];
    const bool ok = p.targets[r] != s.loss.ignore_index && p.targets[r] >= 0 && p.targets[r] < V;
    out.target_logprob_atol[r] =
        ok ? ce.target_logprob_atol[r] + 2 * (row_shift[r] + logit_error[r * V + p.targets[r]])
           : 0.0;
  }
  // Class weights scale a row's loss (and its bound) by up to the largest weight.
  double weight_scale = 1;
  for (double w : p.class_weight) weight_scale = std::max(weight_scale, std::fabs(w));
  for (double& b : row_bound) b *= weight_scale;
  if (s.loss.reduction == Reduction::kNone) {
    out.loss_atol.resize(R);
    for (int64_t r = 0; r < R; ++r) {
      out.loss_atol[r] = row_bound[r] + tol.loss_atol_per_terms * ce.loss_terms[r] +
                         tol.loss.rtol * std::fabs(ce.loss[r]);
    }
  } else {
    double sum = 0;
    for (double b : row_bound) sum += b;
    if (s.loss.reduction == Reduction::kMean && valid > 0) sum /= static_cast<double>(valid);
    out.loss_atol = {sum + tol.loss_atol_per_terms * ce.loss_terms[0] +
                     tol.loss.rtol * std::fabs(ce.loss[0])};
  }

  // The GEMMs: exact sums of the exact gradient, bounded by the gradient's error carried through
  // plus fp32 summation over the inner dimension and the final rounding (once, or once per chunk
  // when accumulating in the output dtype).
  const double rt_out = RoundingRtol(s.dtype), rt_w = RoundingRtol(s.weight_grad());
  const double roundings =
      s.weight_grad_accumulation == WeightGradAccumulation::kOutputDtype ? chunks + 1.0 : 1.0;
  out.d_hidden.assign(R * H, 0.0);
  out.d_hidden_atol.assign(R * H, 0.0);
  ForEachIndex(R, V * H, [&](int64_t r) {
    for (int64_t v = 0; v < V; ++v) {
      const double g = ce.grad[r * V + v], e = grad_error[r * V + v];
      for (int64_t k = 0; k < H; ++k) {
        const double w = p.weight[v * H + k];
        out.d_hidden[r * H + k] += g * w;
        out.d_hidden_atol[r * H + k] += e * std::fabs(w) + (V + 1) * kFp32Unit * std::fabs(g * w);
      }
    }
    for (int64_t k = 0; k < H; ++k) {
      out.d_hidden_atol[r * H + k] +=
          rt_out * std::fabs(out.d_hidden[r * H + k]) + RoundingAtol(s.dtype);
    }
  });
  out.d_weight = p.d_weight_before.empty() ? std::vector<double>(V * H, 0.0) : p.d_weight_before;
  out.d_weight_atol.assign(V * H, 0.0);
  out.d_bias = p.d_bias_before.empty() ? std::vector<double>(V, 0.0) : p.d_bias_before;
  out.d_bias_atol.assign(V, 0.0);
  ForEachIndex(V, R * H, [&](int64_t v) {
    double magnitude_b = std::fabs(out.d_bias[v]);
    for (int64_t r = 0; r < R; ++r) {
      const double g = ce.grad[r * V + v], e = grad_error[r * V + v];
      out.d_bias[v] += g;
      out.d_bias_atol[v] += e + (R + 1) * kFp32Unit * std::fabs(g);
      magnitude_b += std::fabs(g);
    }
    out.d_bias_atol[v] += rt_w * (std::fabs(out.d_bias[v]) + (roundings - 1) * magnitude_b) +
                          RoundingAtol(s.weight_grad());
    for (int64_t k = 0; k < H; ++k) {
      const int64_t i = v * H + k;
      double magnitude = std::fabs(out.d_weight[i]);
      for (int64_t r = 0; r < R; ++r) {
        const double g = ce.grad[r * V + v], h = p.hidden_states[r * H + k];
        out.d_weight[i] += g * h;
        out.d_weight_atol[i] +=
            grad_error[r * V + v] * std::fabs(h) + (R + 1) * kFp32Unit * std::fabs(g * h);
        magnitude += std::fabs(g * h);
      }
      out.d_weight_atol[i] += rt_w * (std::fabs(out.d_weight[i]) + (roundings - 1) * magnitude) +
                              RoundingAtol(s.weight_grad());
    }
  });
  out.logits = std::move(logits);
  out.logit_error.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    out.logit_error[r] = *std::max_element(&logit_error[r * V], &logit_error[r * V] + V);
  }
  return out;
}

std::vector<std::pair<std::string, CompareResult>> CheckLinearCrossEntropy(
    const LinearCrossEntropyOutputs& out, const LinearCrossEntropyResult& ref) {
  std::vector<std::pair<std::string, CompareResult>> results;
  auto check = [&](const char* name, const std::vector<double>* got,
                   const std::vector<double>& want, const std::vector<double>& atol) {
    if (got != nullptr) results.emplace_back(name, Compare(*got, want, {}, atol));
  };
  check("loss", out.loss, ref.loss.loss, ref.loss_atol);
  check("lse", out.lse, ref.loss.lse, ref.lse_atol);
  check("entropy", out.entropy, ref.loss.entropy, ref.entropy_atol);
  check("target_logprob", out.target_logprob, ref.loss.target_logprob, ref.target_logprob_atol);
  if (out.argmax != nullptr) {
    // A row whose top two logits lie within their possible error may pick either: each of the
    // device's logits is within the row's logit_error of its exact value.
    const int64_t R = static_cast<int64_t>(ref.loss.argmax.size());
    const int64_t V = R > 0 ? static_cast<int64_t>(ref.logits.size()) / R : 0;
    std::vector<double> want = ref.loss.argmax, atol(R, 0.0);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t best = static_cast<int64_t>(want[r]);
      const int64_t got = static_cast<int64_t>((*out.argmax)[r]);
      if (got == best || got < 0 || got >= V) continue;
      const double gap = ref.logits[r * V + best] - ref.logits[r * V + got];
      if (gap <= 2 * ref.logit_error[r]) want[r] = got;
    }
    results.emplace_back("argmax", Compare(*out.argmax, want, {0, 0}, atol));
  }
  check("d_hidden", out.d_hidden, ref.d_hidden, ref.d_hidden_atol);
  check("d_weight", out.d_weight, ref.d_weight, ref.d_weight_atol);
  check("d_bias", out.d_bias, ref.d_bias, ref.d_bias_atol);
  return results;
}

}  // namespace kjit::ops
