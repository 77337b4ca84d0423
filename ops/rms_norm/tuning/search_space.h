// The RMSNorm kernels' search space for a hidden size (ops/common/tuning/search_space.h).
//
//   auto space = RmsNormSearchSpace(/*hidden=*/4096, /*vec=*/8);
#pragma once

#include <cstdint>
#include <vector>

#include "ops/common/tuning/search_space.h"
#include "ops/rms_norm/config.h"

namespace kjit::ops {

// Row shapes: sub-warp groups of 1 to 32 threads in blocks of 128 or 256, or one row per block of
// 64 to 1024 threads. The forward and the backward are separate kernels, so they are searched
// apart: every forward shape with the heuristic's backward, and every backward shape with the
// heuristic's forward. Backward shapes whose rows fit the ring kernel (RowFitsRing for
// `elem_bytes`, the dtype's size) are also tried with rings of 2 and 3 rows (4 spills registers
// at hidden 4096: bench/NOTES.md).
std::vector<Candidate<RowShape>> RowShapeSearchSpace(int64_t hidden, int vec);
std::vector<Candidate<RmsNormConfig>> RmsNormSearchSpace(int64_t hidden, int vec,
                                                         int elem_bytes = 2);

}  // namespace kjit::ops
