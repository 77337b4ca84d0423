// The fused linear + cross-entropy's search space around its heuristic
// (ops/common/tuning/search_space.h).
//
//   auto space = LinearCrossEntropySearchSpace(spec, DefaultLinearCrossEntropyConfig(spec));
#pragma once

#include <vector>

#include "kjit/linear_cross_entropy.h"
#include "ops/common/tuning/search_space.h"

namespace kjit::ops {

// What the tuner times around the heuristic: the heuristic, its chunk, a half and a quarter of it
// on one and two streams without whole_rows (two streams over the budget pruned), then each GEMM's
// next 7 cuBLASLt algorithms (an index past those a shape offers runs the first, so it is timed as
// a duplicate, not missed; `kjit bench --sweep` goes on to ops::LtGemm::kMaxAlgos).
std::vector<Candidate<LinearCrossEntropyConfig>> LinearCrossEntropySearchSpace(
    const LinearCrossEntropySpec& spec, const LinearCrossEntropyConfig& heuristic);

}  // namespace kjit::ops
