// Launch configurations of the RMSNorm kernels and the heuristic that picks one without tuning.
//
// A config fixes the vector width (elements per access, chosen by alignment), how many threads share
// one row and how many rows a block holds, separately for forward and backward: the backward wants
// fewer, wider blocks because each row group writes a partial weight-gradient row.
//
//   RmsNormConfig c = DefaultRmsNormConfig(/*hidden=*/4096, /*vec=*/8, /*elem_bytes=*/2);
//   // c.ToString() == "vec=8 fwd=256x1 bwd=512x1x4"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kjit::autotune {

struct RowShape {
  int threads_per_row = 32;  // a power of two <= 32, or a multiple of 32 <= 1024
  int rows_per_block = 1;    // 1 when threads_per_row > 32
  int block_threads() const { return threads_per_row * rows_per_block; }
  bool operator==(const RowShape&) const = default;
};

struct RmsNormConfig {
  int vec = 1;  // elements per vector access; divides hidden
  RowShape forward;
  RowShape backward;
  // Rows each backward row group takes per iteration (loads in flight together, one reduction).
  // More than 1 needs the rows to fit in registers: see MaxBackwardRowsPerIter.
  int backward_rows_per_iter = 1;
  std::string ToString() const;  // "vec=8 fwd=256x1 bwd=512x1x4"
  bool operator==(const RmsNormConfig&) const = default;
};

// The most rows per backward iteration whose dy and x fit the kernel's register budget (the same
// rule as rms_norm.cuh's kKeepRowInRegisters: 128 bytes per thread), at most 4.
int MaxBackwardRowsPerIter(int64_t hidden, int vec, int elem_bytes, const RowShape& backward);

// The widest vector (<= 16 bytes) that divides hidden; alignment of the actual pointers may lower it.
int MaxVecForHidden(int64_t hidden, int elem_bytes);

// A sound default for a hidden size, vector width and element size (of x; weights of another dtype
// only change the vector width).
RmsNormConfig DefaultRmsNormConfig(int64_t hidden, int vec, int elem_bytes);

// Every row shape worth timing for a hidden size and vector width: sub-warp groups in blocks of 128
// or 256 threads, or one row per block of 64 to 1024 threads, each thread walking 1 to 16 vectors.
std::vector<RowShape> RowShapeCandidates(int64_t hidden, int vec);

}  // namespace kjit::autotune
