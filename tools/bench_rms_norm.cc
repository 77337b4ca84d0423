// `kjit bench --op rms_norm`: RMSNorm forward, backward and both on an autotune::RmsNormTrial,
// checked against the fp64 reference before timing, for the config a launch at this row count
// uses (the tuning database's, else the heuristic's) and (--sweep) every candidate of the search
// space.
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autotune/search_space.h"
#include "autotune/trial.h"
#include "tools/bench.h"

namespace kjit::tools {

absl::StatusOr<nlohmann::json> BenchRmsNorm(
    const Runtime& rt, autotune::GpuTimer& timer, DType dtype, int64_t hidden, int64_t rows,
    int repeats, double copy_gbps, const std::vector<std::optional<autotune::RmsNormConfig>>& configs) {
  const RmsNormSpec spec{.hidden = hidden, .dtype = dtype};
  KJIT_ASSIGN_OR_RETURN(auto trial, autotune::RmsNormTrial::Create(rt, spec, rows));
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& config : configs) {
    RmsNormSpec s = spec;
    s.config = config;
    KJIT_ASSIGN_OR_RETURN(RmsNorm norm, rt.RmsNorm(s));
    KJIT_RETURN_IF_ERROR(trial->Check(norm));
    // Without an explicit config the op picks one per row count: tuned or heuristic.
    const autotune::RmsNormConfig used = norm.ConfigFor(rows);
    const bool tuned = !config && !(used == norm.config());
    for (autotune::Pass pass :
         {autotune::Pass::kForward, autotune::Pass::kBackward, autotune::Pass::kForwardBackward}) {
      KJIT_ASSIGN_OR_RETURN(autotune::Timing t, trial->Time(norm, pass, timer, repeats));
      entries.push_back(BenchEntry(
          {.op = "rms_norm", .pass = autotune::Name(pass),
           .shape = fmt::format("hidden={} rows={}", hidden, rows),
           .config = used.ToString(), .dtype = dtype,
           .heuristic = !config && !tuned, .bytes = trial->Bytes(pass),
           .extra = {{"hidden", hidden}, {"rows", rows}, {"tuned", tuned}}},
          t, copy_gbps));
    }
  }
  return entries;
}

// The op's own choice, then (when sweeping) every other candidate of the search space: each
// forward shape with the heuristic's backward and each backward shape with its forward.
std::vector<std::optional<autotune::RmsNormConfig>> RmsNormConfigs(DType dtype, int64_t hidden,
                                                                    bool sweep) {
  std::vector<std::optional<autotune::RmsNormConfig>> out = {std::nullopt};
  if (!sweep) return out;
  const int vec = autotune::MaxVecForHidden(hidden, static_cast<int>(SizeOf(dtype)));
  const autotune::RmsNormConfig heuristic = autotune::DefaultRmsNormConfig(hidden, vec);
  for (const auto& c : autotune::Unpruned(autotune::RmsNormSearchSpace(hidden, vec))) {
    if (!(c == heuristic)) out.push_back(c);
  }
  return out;
}

}  // namespace kjit::tools
