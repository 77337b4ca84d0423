// Shared by the `kjit bench` ops: one report entry per measurement (time, effective bandwidth and
// its ratio to the copy measured in the same run), and the benchmark of each op.
//
//   KJIT_ASSIGN_OR_RETURN(DeviceBuffer x, UploadValues(rt, values, DType::kBF16));
//   entries.push_back(BenchEntry({.op = "rms_norm", .pass = "forward", ...}, timing, copy_gbps));
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autotune/gpu_timer.h"
#include "runtime/device_buffer.h"
#include "runtime/kjit.h"

namespace kjit::tools {

struct BenchCase {
  std::string op, pass, shape, config;
  DType dtype = DType::kBF16;
  bool heuristic = true;  // the config is the built-in heuristic's
  double bytes = 0;       // the fewest bytes the pass must move
  nlohmann::json extra = nlohmann::json::object();  // op-specific fields (hidden, vocab, rows...)
};
nlohmann::json BenchEntry(const BenchCase& c, const autotune::Timing& t, double copy_gbps);

// Times `rows` of RMSNorm at `hidden` under each config (nullopt: the op's own choice, tuned or
// heuristic), checked first.
absl::StatusOr<nlohmann::json> BenchRmsNorm(
    const Runtime& rt, autotune::GpuTimer& timer, DType dtype, int64_t hidden, int64_t rows,
    int repeats, double copy_gbps,
    const std::vector<std::optional<autotune::RmsNormConfig>>& configs);
std::vector<std::optional<autotune::RmsNormConfig>> RmsNormConfigs(DType dtype, int64_t hidden,
                                                                    bool sweep);

// Times cross-entropy (mean, gradient in place; and forward alone) at `vocab` x `rows` under each
// config (nullopt: the op's own choice, tuned or heuristic), checked first on sampled rows.
absl::StatusOr<nlohmann::json> BenchCrossEntropy(
    const Runtime& rt, autotune::GpuTimer& timer, DType dtype, int64_t vocab, int64_t rows,
    int repeats, double copy_gbps,
    const std::vector<std::optional<autotune::CrossEntropyConfig>>& configs);
std::vector<std::optional<autotune::CrossEntropyConfig>> CrossEntropyConfigs(const Runtime& rt,
                                                                            DType dtype,
                                                                            int64_t vocab,
                                                                            bool sweep);

}  // namespace kjit::tools
