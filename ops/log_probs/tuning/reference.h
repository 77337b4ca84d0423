// The RL heads' fp64 reference (kjit/log_probs.h's definitions, computed in double): what the GPU
// suite checks LogProbs against, row by row. Logits are given as the values the device reads
// (decoded from the dtype).
//
//   LogProbsResult r = LogProbsReference(spec, rows, logits, targets, &g_lp, &g_h);
//   r.logprob[i], r.entropy[i], r.lse[i]; r.grad[i * vocab + j]   (with a gradient asked)
#pragma once

#include <cstdint>
#include <vector>

#include "kjit/log_probs.h"

namespace kjit::ops {

struct LogProbsResult {
  std::vector<double> logprob;  // [rows]: z_t / T - lse, 0 for an ignored row
  std::vector<double> entropy;  // [rows]: -sum p ln p, 0 for an ignored row (always computed)
  std::vector<double> lse;      // [rows]: lse(z / T), every row
  std::vector<double> grad;     // [rows * vocab] when an upstream gradient was given, else empty
};

// `logits` is rows x spec.vocab, row-major; `targets` [rows]. grad_logprob and grad_entropy are
// [rows] or null (that term left out); with either, `grad` holds
//   d z_j = (g_lp (1[j = t] - p_j) - g_H p_j (ln p_j + H)) / T   (0 for an ignored row, and for
// a class of probability 0).
LogProbsResult LogProbsReference(const LogProbsSpec& spec, int64_t rows,
                                 const std::vector<double>& logits,
                                 const std::vector<int64_t>& targets,
                                 const std::vector<double>* grad_logprob,
                                 const std::vector<double>* grad_entropy);

}  // namespace kjit::ops
