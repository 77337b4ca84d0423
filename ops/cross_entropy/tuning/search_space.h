// The cross-entropy kernels' search space for a vocab and GPU (ops/common/tuning/search_space.h).
//
//   auto space = CrossEntropySearchSpace(/*vocab=*/128256, /*vec=*/8, /*arch=*/90);
#pragma once

#include <cstdint>
#include <vector>

#include "ops/common/tuning/search_space.h"
#include "ops/cross_entropy/config.h"

namespace kjit::ops {

// Threads 128 to 1024; streaming (cluster 0) with unroll 1, 2, 4 or 8, and the row held by 1, 2, 4
// or 8 blocks, in registers or staged in shared memory (unroll then only shapes the forward-only
// kernel: the heuristic's). The heuristic's config is always a candidate. `vec` is the widest
// vector (16 bytes), which gives the element size.
std::vector<Candidate<CrossEntropyConfig>> CrossEntropySearchSpace(int64_t vocab, int vec,
                                                                   int arch);

}  // namespace kjit::ops
