// Shared by `kjit bench` and kjit-bench-sharded: one report entry per measurement (time, effective
// bandwidth and its ratio to the copy measured in the same run).
//
//   entries.push_back(BenchEntry({.op = "rms_norm", .pass = "forward", ...}, timing, copy_gbps));
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "autotune/gpu_timer.h"
#include "kjit/kjit.h"

namespace kjit::tools {

struct BenchCase {
  std::string op, pass, shape, config;
  DType dtype = DType::kBF16;
  bool heuristic = true;                            // the config is the built-in heuristic's
  double bytes = 0;                                 // the fewest bytes the pass must move
  nlohmann::json extra = nlohmann::json::object();  // op-specific fields (hidden, vocab, rows...)
};
nlohmann::json BenchEntry(const BenchCase& c, const autotune::Timing& t, double copy_gbps);

}  // namespace kjit::tools
