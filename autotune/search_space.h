// The autotuner's search spaces: every launch config an op's kernels take for a shape and GPU,
// each either a candidate or pruned before compiling, with the reason (too many registers, a
// cluster the arch lacks, threads with nothing to do). `kjit-tune --json` reports the pruned ones,
// so a missing config is explained, not silently absent.
//
//   for (const auto& c : CrossEntropySearchSpace(/*vocab=*/128256, /*vec=*/8, /*arch=*/90)) {
//     if (c.pruned.empty()) Compile(c.config); else Log(c.config.ToString(), c.pruned);
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autotune/cross_entropy_config.h"
#include "autotune/rms_norm_config.h"

namespace kjit::autotune {

template <typename Config>
struct Candidate {
  Config config;
  std::string pruned;  // why it cannot run or cannot win; empty for a candidate
};

// Threads 128 to 1024; streaming (cluster 0) with unroll 1, 2, 4 or 8, and the row held by 1, 2, 4
// or 8 blocks, in registers or staged in shared memory (unroll then only shapes the forward-only
// kernel: the heuristic's). The heuristic's config is always a candidate. `vec` is the widest
// vector (16 bytes), which gives the element size.
std::vector<Candidate<CrossEntropyConfig>> CrossEntropySearchSpace(int64_t vocab, int vec,
                                                                   int arch);

// Row shapes: sub-warp groups of 1 to 32 threads in blocks of 128 or 256, or one row per block of
// 64 to 1024 threads. The forward and the backward are separate kernels, so they are searched
// apart: every forward shape with the heuristic's backward, and every backward shape with the
// heuristic's forward.
std::vector<Candidate<RowShape>> RowShapeSearchSpace(int64_t hidden, int vec);
std::vector<Candidate<RmsNormConfig>> RmsNormSearchSpace(int64_t hidden, int vec);

// The candidates alone.
template <typename Config>
std::vector<Config> Unpruned(const std::vector<Candidate<Config>>& space) {
  std::vector<Config> out;
  for (const auto& c : space) {
    if (c.pruned.empty()) out.push_back(c.config);
  }
  return out;
}

}  // namespace kjit::autotune
