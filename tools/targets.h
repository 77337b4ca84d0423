// Shared by `kjit`'s subcommands and `kjit-tune`: checking flags as CLI11 parses them, turning
// --arch into runtimes, and printing errors.
//
//   cmd->add_option("--dtype", f->dtype)->check(DTypeValidator());
//   cmd->final_callback([f] { ThrowIfUsageError(CheckFlags(*f)); });
//   KJIT_ASSIGN_OR_RETURN(std::vector<Runtime> rts, RuntimesForArch("auto"));
//
// The README's rule: a usage error (anything wrong with the flags as typed, found before any work)
// exits 2, a failure while working 1. CLI11 reports its own checks as usage errors; the validators
// and ThrowIfUsageError below make ours go the same way, so that they are found by parsing alone.
#pragma once

#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "kjit/kjit.h"

namespace kjit::tools {

// A dtype ParseDType accepts (fp32, fp16, bf16 and their aliases).
CLI::Validator DTypeValidator();
// "auto", or comma-separated targets that each parse and that NVRTC can compile for when it loads:
// an --arch no NVRTC can build for (sm_10, sm_999) is a mistake in the flags, found before any
// work. (Without NVRTC the compile fails later, as a failure.)
CLI::Validator ArchValidator();

// With explicit targets (`arch` not "auto"): that the dtype of each flag given (a name ParseDType
// takes; "" when not given) compiles for every target, so that --dtype bf16 --arch sm_75 is a usage
// error ("--dtype: bf16 needs sm_80 or newer, ...") before any compile.
absl::Status CheckDTypesForArch(
    const std::string& arch, const std::vector<std::pair<std::string, std::string>>& dtype_flags);

// How a command's own check of its parsed flags (in a final_callback) reports a usage error:
// throws CLI::ValidationError with the status's message unless it is OK, so that CLI11 prints it
// and exits 2 like its own errors.
void ThrowIfUsageError(const absl::Status& status);

// A usage error as the tools print it, for an app's failure_message: "kjit-tune: " and CLI11's own
// message ("--jobs: Value 0 not in range 1 to 256"), then where to find help.
std::string UsageMessage(const CLI::App* app, const CLI::Error& e);
// Parses argv into `app` (CLI11 runs the validators and final_callbacks too): nullopt when the
// flags are good, else the exit code, having written the text: 0 after --help or --version
// (to `out`), 2 after a usage error (to `err`, as app's failure_message says). An empty value is
// a usage error for every option that takes a value, and an integer is decimal ("010" is 10; "0x8"
// and "+8" are usage errors).
std::optional<int> ParseFlags(CLI::App& app, int argc, const char* const* argv, std::ostream& out,
                              std::ostream& err);

// "auto": a runtime on GPU 0 when a driver and GPU are present (and use_gpu), else compile-only
// runtimes for the default prebuild targets (sm_90, sm_100), with a note on stderr when a GPU was
// looked for. Otherwise a comma-separated list of targets, each compile-only.
absl::StatusOr<std::vector<Runtime>> RuntimesForArch(const std::string& arch, bool use_gpu = true);

// A runtime on GPU `ordinal`, which the user asked for by number (`--device`): unlike "auto" it
// does not fall back to compiling only, and its error names the flag.
absl::StatusOr<Runtime> RuntimeOnDevice(int ordinal);

// The name the tool's messages start with: "kjit" unless main sets another ("kjit-tune").
void SetToolName(std::string name);
// Prints "<tool>: <message>" to stderr and returns 1.
int Fail(const absl::Status& status);

}  // namespace kjit::tools
