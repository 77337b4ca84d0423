// Shared by the subcommands: turning --arch into runtimes, and printing errors.
//
//   KJIT_ASSIGN_OR_RETURN(std::vector<Runtime> rts, RuntimesForArch("auto"));
#pragma once

#include <string>
#include <vector>

#include "runtime/kjit.h"

namespace kjit::tools {

// "auto": a runtime on GPU 0 when a driver and GPU are present (and use_gpu), else compile-only
// runtimes for the default prebuild targets (sm_90, sm_100), with a note on stderr when a GPU was
// looked for. Otherwise a comma-separated list of targets, each compile-only.
absl::StatusOr<std::vector<Runtime>> RuntimesForArch(const std::string& arch, bool use_gpu = true);

// Prints "kjit: <message>" to stderr and returns 1.
int Fail(const absl::Status& status);

}  // namespace kjit::tools
