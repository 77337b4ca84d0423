// `kjit bench --op linear_cross_entropy`: the fused lm_head + loss timed beside the three GEMMs
// alone, the unfused path and the loss kernel alone, in one run (bench_linear_cross_entropy.cc).
//
//   KJIT_ASSIGN_OR_RETURN(nlohmann::json entries, BenchLinearCrossEntropy(
//       rt, timer, {.vocab = 128256, .hidden = 4096, .rows = 8192}, DType::kBF16, 10, copy_gbps,
//       /*sweep=*/false, /*configs=*/{}));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autotune/gpu_timer.h"
#include "kjit/kjit.h"

namespace kjit::tools {

struct LinearCrossEntropyBenchShape {
  int64_t vocab = 0, hidden = 0, rows = 0;
};
// The standard set: LLaMA 3 8B's lm_head at 4096, 8192 and 16384 tokens, Gemma 2 9B's and Qwen 2
// 7B's at 8192.
std::vector<LinearCrossEntropyBenchShape> LinearCrossEntropyBenchShapes();

// The report's entries for one shape: the baselines, then the op's own config (fp32 and
// output-dtype weight-gradient accumulation, and where the heuristic takes the rows as one chunk,
// its chunked schedule beside), or `configs` (as ToString() prints them), or with `sweep` the
// configs around the heuristic's, each GEMM alone with every cuBLASLt algorithm for its shape, and
// the three with their fastest (and, where the heuristic takes the rows whole, the op with them).
absl::StatusOr<nlohmann::json> BenchLinearCrossEntropy(const Runtime& rt, autotune::GpuTimer& timer,
                                                       const LinearCrossEntropyBenchShape& shape,
                                                       DType dtype, int repeats, double copy_gbps,
                                                       bool sweep,
                                                       const std::vector<std::string>& configs);

}  // namespace kjit::tools
