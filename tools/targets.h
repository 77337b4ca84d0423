// Shared by the subcommands: turning --arch into runtimes, and printing errors.
//
//   KJIT_ASSIGN_OR_RETURN(std::vector<Runtime> rts, RuntimesForArch("auto"));
#pragma once

#include <string>
#include <vector>

#include "kjit/kjit.h"

namespace kjit::tools {

// "auto": a runtime on GPU 0 when a driver and GPU are present (and use_gpu), else compile-only
// runtimes for the default prebuild targets (sm_90, sm_100), with a note on stderr when a GPU was
// looked for. Otherwise a comma-separated list of targets, each compile-only.
absl::StatusOr<std::vector<Runtime>> RuntimesForArch(const std::string& arch, bool use_gpu = true);

// A runtime on GPU `ordinal`, which the user asked for by number (`--device`): unlike "auto" it
// does not fall back to compiling only, and its error names the flag.
absl::StatusOr<Runtime> RuntimeOnDevice(int ordinal);

// Prints "kjit: <message>" to stderr and returns 1.
int Fail(const absl::Status& status);

}  // namespace kjit::tools
