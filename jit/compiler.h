// Compile: Source -> Binary through NVRTC, for one target.
//
// No toolkit include path is passed: the templates are self-contained, so a machine with libnvrtc
// alone compiles them. A failed compile returns InvalidArgument (the source is wrong for these
// parameters) or Internal, whose message carries the NVRTC log, the options, the target and the
// op's parameters; the log is also attached as the payload kCompileLogPayload.
//
//   KJIT_ASSIGN_OR_RETURN(const Nvrtc* nvrtc, Nvrtc::Get());
//   KJIT_ASSIGN_OR_RETURN(Binary bin, Compile(*nvrtc, source, target));
#pragma once

#include <string>
#include <vector>

#include "jit/binary.h"
#include "jit/nvrtc.h"
#include "jit/source.h"
#include "jit/target.h"

namespace kjit::jit {

inline constexpr char kCompileLogPayload[] = "kjit.dev/compile_log";

// The exact options Compile passes for `target`; part of the cache key.
std::vector<std::string> CompileOptions(const Target& target);

absl::StatusOr<Binary> Compile(const Nvrtc& nvrtc, const Source& source, const Target& target);

}  // namespace kjit::jit
