// The fp64 CPU reference of the fused cross-entropy, its tolerances and the check the tests, the
// benchmark's pre-timing check and the autotuner's candidate check share.
//
// Inputs are the values the device holds (logits already rounded to their dtype). The reference
// follows the kernel's definitions (ignored and out-of-range rows, NaN/Inf rules, argmax over the
// raw logits) in exact arithmetic, so what remains is the kernel's fp32 arithmetic and its final
// rounding of the gradient.
//
//   CrossEntropyMath m{.vocab = 128256, .dtype = DType::kBF16, .loss = spec.loss};
//   CrossEntropyResult ref = CrossEntropyReference(m, rows, logits, targets, nullptr, true);
//   for (auto& [name, r] : CheckCrossEntropy(m, {.loss = &loss, .grad = &grad}, ref)) ...
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "jit/dtype.h"
#include "kjit/loss_options.h"
#include "ops/common/tuning/compare.h"
#include "ops/cross_entropy/config.h"

namespace kjit::ops {

struct CrossEntropyMath {
  int64_t vocab = 0;
  DType dtype = DType::kBF16;  // of the logits and the gradient
  // The spec's options, all of them used: every per-row output is computed, and class_weight below
  // holds the weights' values (class_weight_dtype is not read).
  LossOptions loss;
  // Per-class weights (the values the device holds), [vocab]; empty: none. The loss and gradient
  // follow kjit/cross_entropy.h (PyTorch's `weight`), the mean divides by the valid rows' w_t.
  std::vector<double> class_weight;
};

struct CrossEntropyResult {
  std::vector<double> loss;      // [rows] (none) or [1]
  std::vector<double> row_loss;  // [rows]; 0 for ignored rows
  std::vector<double> lse;       // [rows], every row (ignored ones too)
  std::vector<double> argmax;    // [rows], every row: first maximal raw logit, NaN the largest
  // [rows], every row: -sum_j p_j ln p_j of the capped logits' softmax (NaN for a row all -inf
  // or holding NaN/+Inf), and the bound a kernel's fp32 result must keep to.
  std::vector<double> entropy, entropy_atol;
  // [rows]: x_t - lse (capped) for valid rows, 0 for ignored ones; and its bound.
  std::vector<double> target_logprob, target_logprob_atol;
  std::vector<double> counters;  // {valid_rows, out_of_range_rows}
  // [rows]: |upstream gradient / (the mean's divisor)| times |p's factor| (A + 2 z w_t lse).
  std::vector<double> row_scale;
  std::vector<double> grad;  // [rows * vocab], before the final rounding (when asked)
  // [rows * vocab]: row_scale * slope * (p (|A| + 2 z |w_t lse|) + eps |w_j| / V +
  // (1 - eps) |w_t| onehot) (w = 1, A = 1 without class weights; Gradient in the template), the
  // size of the terms a gradient entry combines. The kernel's fp32 error is relative to these, not
  // to the entry, which cancels (p - 1 near p = 1, p - eps/V); the soft-cap slope's own rounding
  // scales the whole sum.
  std::vector<double> grad_terms;
  // Same shape as loss: |w_t| (1 + |lse| + |x_t| + z lse^2) + eps mean_j |w_j| (|lse| + |x_j|)
  // (summed for sum, and over |the divisor| for mean), the size of what the loss was computed
  // from; 0 for ignored rows, whose loss must be exactly 0.
  std::vector<double> loss_terms;
};

// logits: [rows, vocab] contiguous; targets: [rows]; grad_output: null (1), [1] (sum, mean) or
// [rows] (none). The gradient is computed only when with_grad.
CrossEntropyResult CrossEntropyReference(const CrossEntropyMath& m, int64_t rows,
                                         const std::vector<double>& logits,
                                         const std::vector<int64_t>& targets,
                                         const std::vector<double>* grad_output, bool with_grad);

// loss and lse: fp32 arithmetic over the row, relative to the terms (atol = per_terms * terms);
// argmax and counters: exact; grad: one rounding to the dtype (rtol) plus the fp32 error of p
// relative to the terms, plus fp32's smallest normal times the row's scale.
struct CrossEntropyTolerances {
  Tolerance loss{1e-6, 0}, lse{1e-6, 1e-5}, grad{0, 0};
  double loss_atol_per_terms = 1e-5;
  double grad_atol_per_terms = 5e-5;
  // The kernels' exponentials flush p below 2^-126 (fp32's smallest normal) to 0, which the
  // row's scale then multiplies.
  double grad_atol_per_row_scale = 0x1p-126;
};
CrossEntropyTolerances CrossEntropyTolerancesFor(DType dtype);

// The per-element atol CheckCrossEntropy uses for the gradient (for self-tests).
std::vector<double> CrossEntropyGradAtol(const CrossEntropyMath& m, const CrossEntropyResult& ref,
                                         const CrossEntropyTolerances& tol);

// What a kernel produced, decoded to double; null ones are not checked.
struct CrossEntropyOutputs {
  const std::vector<double>* loss = nullptr;
  const std::vector<double>* lse = nullptr;
  const std::vector<double>* argmax = nullptr;
  const std::vector<double>* entropy = nullptr;
  const std::vector<double>* target_logprob = nullptr;
  const std::vector<double>* counters = nullptr;  // {valid_rows, out_of_range_rows}
  const std::vector<double>* grad = nullptr;
};

// The gradient of the reference's rows [first, first + grad.size() / vocab) alone, with
// CheckCrossEntropy's tolerance: for callers that download and check a few rows at a time.
CompareResult CheckCrossEntropyGradRows(const CrossEntropyMath& m, const CrossEntropyResult& ref,
                                        int64_t first, std::span<const double> grad);

// Compares every given output with the reference; one (name, result) per output checked.
std::vector<std::pair<std::string, CompareResult>> CheckCrossEntropy(const CrossEntropyMath& m,
                                                                     const CrossEntropyOutputs& out,
                                                                     const CrossEntropyResult& ref);

}  // namespace kjit::ops
