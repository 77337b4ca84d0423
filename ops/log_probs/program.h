// The RL heads' programs (kjit/log_probs.h): the spec's checks, the heuristic config and the
// rendering of its two kernels, forward and backward, each a program (and cache entry) of its own
// so that a forward-only pass (an old or reference policy) compiles only the forward. No GPU
// needed.
//
//   KJIT_ASSIGN_OR_RETURN(jit::Source fwd, RenderLogProbs(spec, config,
//   LogProbsProgram::kForward));
#pragma once

#include <map>
#include <string>
#include <vector>

#include "jit/source.h"
#include "kjit/log_probs.h"

namespace kjit::ops {

enum class LogProbsProgram { kForward, kBackward };
const char* LogProbsProgramName(LogProbsProgram program);  // "forward", "backward"

// The config a spec launches with on GPUs of compute capability `arch`: the spec's, else cross-
// entropy's heuristic for the vocab, its streaming fields only (cluster and staged 0).
CrossEntropyConfig LogProbsConfig(const LogProbsSpec& spec, int arch);
// InvalidArgument naming the field when `config` cannot run `spec`.
absl::Status ValidateLogProbsConfig(const LogProbsSpec& spec, const CrossEntropyConfig& config);

// The op's parameters, as LogProbs::Build reports them (no config).
std::map<std::string, std::string> LogProbsParams(const LogProbsSpec& spec);

// One program, named "log_probs.<program>", its params the spec's but for the temperature and
// ignore_index (launch arguments: one program serves every temperature) and the config's vec,
// threads and unroll; the headers are cross-entropy's (whose row layout and statistics it reuses,
// and which it leaves untouched) and log_probs.cuh.
absl::StatusOr<jit::Source> RenderLogProbs(const LogProbsSpec& spec,
                                           const CrossEntropyConfig& config,
                                           LogProbsProgram program);
// Both, forward first: what LogProbs::Build compiles.
absl::StatusOr<std::vector<jit::Source>> RenderLogProbsPrograms(const LogProbsSpec& spec,
                                                                const CrossEntropyConfig& config);

}  // namespace kjit::ops
