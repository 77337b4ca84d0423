// `kjit bench --op cross_entropy`: the fused loss and gradient (mean reduction, gradient written in
// place into the logits) and the forward alone, on an autotune::CrossEntropyTrial: checked on
// sampled rows against the fp64 reference before timing, for the config a launch at this row count
// uses (the tuning database's, else the heuristic's) and (--sweep) every candidate of the search
// space. The logits are restored from a pristine copy before every timed repeat (untimed).
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autotune/search_space.h"
#include "autotune/trial.h"
#include "tools/bench.h"

namespace kjit::tools {

absl::StatusOr<nlohmann::json> BenchCrossEntropy(
    const Runtime& rt, autotune::GpuTimer& timer, DType dtype, int64_t vocab, int64_t rows,
    int repeats, double copy_gbps,
    const std::vector<std::optional<autotune::CrossEntropyConfig>>& configs) {
  const CrossEntropySpec spec{.vocab = vocab, .dtype = dtype, .target_type = IndexType::kInt64,
                              .reduction = Reduction::kMean};
  KJIT_ASSIGN_OR_RETURN(auto trial, autotune::CrossEntropyTrial::Create(rt, spec, rows));
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& config : configs) {
    CrossEntropySpec s = spec;
    s.config = config;
    KJIT_ASSIGN_OR_RETURN(CrossEntropy ce, rt.CrossEntropy(s));
    KJIT_RETURN_IF_ERROR(trial->Check(ce));
    for (autotune::Pass pass : {autotune::Pass::kForwardBackward, autotune::Pass::kForward}) {
      KJIT_ASSIGN_OR_RETURN(autotune::Timing t, trial->Time(ce, pass, timer, repeats));
      // Without an explicit config the op picks one per row count and pass: tuned or heuristic.
      const autotune::CrossEntropyConfig used =
          ce.ConfigFor(rows, /*fused=*/pass == autotune::Pass::kForwardBackward);
      const bool tuned = !config && !(used == ce.config());
      entries.push_back(BenchEntry(
          {.op = "cross_entropy", .pass = autotune::Name(pass),
           .shape = fmt::format("vocab={} rows={}", vocab, rows),
           .config = used.ToString(), .dtype = dtype,
           .heuristic = !config && !tuned, .bytes = trial->Bytes(pass),
           .extra = {{"vocab", vocab},
                     {"rows", rows},
                     {"tuned", tuned},
                     {"extra_device_bytes", trial->workspace_bytes()},
                     {"checked_rows", trial->checked_rows()}}},
          t, copy_gbps));
    }
  }
  return entries;
}

// The op's own choice, then (when sweeping) every other candidate of the search space.
std::vector<std::optional<autotune::CrossEntropyConfig>> CrossEntropyConfigs(const Runtime& rt,
                                                                            DType dtype,
                                                                            int64_t vocab,
                                                                            bool sweep) {
  std::vector<std::optional<autotune::CrossEntropyConfig>> out = {std::nullopt};
  if (!sweep) return out;
  const int vec = autotune::MaxVecForCrossEntropy(static_cast<int>(SizeOf(dtype)));
  const int arch = rt.target().arch;
  const autotune::CrossEntropyConfig heuristic = autotune::DefaultCrossEntropyConfig(
      vocab, vec, arch, static_cast<int>(SizeOf(dtype)));
  for (const auto& c : autotune::Unpruned(autotune::CrossEntropySearchSpace(vocab, vec, arch))) {
    if (!(c == heuristic)) out.push_back(c);
  }
  return out;
}

}  // namespace kjit::tools
