// RMSNorm launch configs (kjit/rms_norm.h, which declares their parser): their text form and the
// heuristic that picks one without tuning.
//
// A config fixes the vector width (elements per access, chosen by alignment), how many threads
// share one row and how many rows a block holds, separately for forward and backward: the backward
// wants fewer, wider blocks because each row group writes a partial weight-gradient row.
//
//   RmsNormConfig c = DefaultRmsNormConfig(/*hidden=*/4096, /*max_vec=*/8);
//   // c.ToString() == "vec=8 fwd=256x1 bwd=512x1r2"
//   // ParseRmsNormConfig(c.ToString()) == c
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kjit/rms_norm.h"

namespace kjit::ops {

// The widest vector (<= 16 bytes) that divides hidden; alignment of the actual pointers may lower
// it.
int MaxVecForHidden(int64_t hidden, int elem_bytes);

// The inverse of Name(RmsNormCasting): "llama", "gemma" or "none"; else InvalidArgument
// "casting: '<text>' is not a casting (llama, gemma, none)".
absl::StatusOr<RmsNormCasting> ParseRmsNormCasting(std::string_view text);

// Whether a backward row shape can run the ring kernel (RowShape::ring): each thread's share of a
// row of dy and of x, at full vectors, fits in 2 x 64 bytes (kKeepRowInRegisters in rms_norm.cuh).
bool RowFitsRing(int64_t hidden, int vec, int elem_bytes, const RowShape& backward);

// A sound default for a hidden size and vector width.
RmsNormConfig DefaultRmsNormConfig(int64_t hidden, int vec);

}  // namespace kjit::ops
