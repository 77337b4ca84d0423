// Random inputs that a device holds exactly: for the checks of kjit's kernels (tests, trials,
// doctor's probe, the benchmarks), not for users, so not installed.
//
//   std::mt19937_64 rng(42);
//   std::vector<double> logits = kjit::ops::RandomValues(rng, rows * vocab, 2.0, 0.0,
//   DType::kBF16); KJIT_RETURN_IF_ERROR(buffer.Upload(kjit::Encode(logits, DType::kBF16)));
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kjit/dtype.h"
#include "kjit/host_convert.h"

namespace kjit::ops {

// n normal values of mean `offset` and deviation `scale`, each rounded to `dtype`.
inline std::vector<double> RandomValues(std::mt19937_64& rng, int64_t n, double scale,
                                        double offset, DType dtype) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& e : v) e = RoundTo(offset + scale * normal(rng), dtype);
  return v;
}

}  // namespace kjit::ops
