// The fp64 CPU reference of the fused linear + cross-entropy and the bounds a device result must
// keep to, for the GPU tests and the benchmark's pre-timing check.
//
// The device sums the logits in fp32 and rounds them to the dtype, rounds the loss's gradient to
// it again, and sums the GEMMs in fp32. The reference rounds the exact logits to the dtype as the
// device does, computes the rest exactly, and bounds each output by what the remaining
// differences can move it: a logit whose fp32 sum may land across a rounding boundary, the
// gradient's rounding, fp32 summation (each bound sums the magnitudes of the terms an entry
// combines, so a wrong row, a missing term or a 3% error still fails).
//
//   LinearCrossEntropyProblem p{.rows = 64, .vocab = 50257, .hidden = 96, ...};
//   LinearCrossEntropyResult ref = LinearCrossEntropyReference(spec, p, /*chunks=*/3);
//   CompareResult r = Compare(d_hidden, ref.d_hidden, {}, ref.d_hidden_atol);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kjit/linear_cross_entropy.h"
#include "ops/common/tuning/compare.h"
#include "ops/cross_entropy/tuning/reference.h"

namespace kjit::ops {

struct LinearCrossEntropyProblem {
  int64_t rows = 0, vocab = 0, hidden = 0;
  std::vector<double> hidden_states;  // [rows, hidden], the values the device holds
  std::vector<double> weight;         // [vocab, hidden]
  std::vector<double> bias;           // [vocab] or empty
  std::vector<int64_t> targets;       // [rows]
  std::vector<double> grad_output;    // empty, [1] (sum, mean) or [rows] (none)
  std::vector<double> class_weight;   // [vocab], the values the device holds; empty: none
  std::vector<double> d_weight_before, d_bias_before;  // what accumulate adds to; empty: 0
};

struct LinearCrossEntropyResult {
  CrossEntropyResult loss;          // on the exact logits, with the gradient
  std::vector<double> logits;       // [rows, vocab], the exact ones rounded to the dtype
  std::vector<double> logit_error;  // [rows]: how far the device's logits of the row may be off
  std::vector<double> d_hidden, d_weight, d_bias;
  // Per-element bounds for Compare's atol_per_element (rtol 0).
  std::vector<double> loss_atol, lse_atol, entropy_atol, target_logprob_atol, d_hidden_atol,
      d_weight_atol, d_bias_atol;
};

// `chunks`: how many times kOutputDtype accumulation rounds d_weight and d_bias (ignored for fp32).
LinearCrossEntropyResult LinearCrossEntropyReference(const LinearCrossEntropySpec& spec,
                                                     const LinearCrossEntropyProblem& p,
                                                     int64_t chunks);

// What a launch wrote, decoded; null ones are not checked.
struct LinearCrossEntropyOutputs {
  const std::vector<double>* loss = nullptr;
  const std::vector<double>* lse = nullptr;
  const std::vector<double>* argmax = nullptr;  // checked only where the row's top two logits
                                                // are further apart than their possible error
  const std::vector<double>* entropy = nullptr;
  const std::vector<double>* target_logprob = nullptr;
  const std::vector<double>* d_hidden = nullptr;
  const std::vector<double>* d_weight = nullptr;
  const std::vector<double>* d_bias = nullptr;
};
std::vector<std::pair<std::string, CompareResult>> CheckLinearCrossEntropy(
    const LinearCrossEntropyOutputs& out, const LinearCrossEntropyResult& ref);

}  // namespace kjit::ops
