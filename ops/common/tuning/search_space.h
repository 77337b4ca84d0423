// A search space entry: every launch config an op's kernels take for a shape and GPU is either a
// candidate or pruned before compiling, with the reason (too many registers, a cluster the arch
// lacks, threads with nothing to do). `kjit-tune --json` reports the pruned ones, so a missing
// config is explained, not silently absent. Each op's search_space.h enumerates its own.
//
//   for (const auto& c : CrossEntropySearchSpace(/*vocab=*/128256, /*vec=*/8, /*arch=*/90)) {
//     if (c.pruned.empty()) Compile(c.config); else Log(c.config.ToString(), c.pruned);
//   }
#pragma once

#include <string>
#include <vector>

namespace kjit::ops {

template <typename Config>
struct Candidate {
  Config config;
  std::string pruned;  // why it cannot run or cannot win; empty for a candidate
};

// The candidates alone.
template <typename Config>
std::vector<Config> Unpruned(const std::vector<Candidate<Config>>& space) {
  std::vector<Config> out;
  for (const auto& c : space) {
    if (c.pruned.empty()) out.push_back(c.config);
  }
  return out;
}

}  // namespace kjit::ops
