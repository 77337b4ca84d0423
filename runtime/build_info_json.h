// Internal: the JSON of a BuildInfo's programs, shared by BuildInfo::ToJson (the C API's
// kjit_*_build) and the reports that lay out the rest themselves (`kjit compile --json`), so that
// every report lists an op's programs alike.
//
//   report["programs"] = internal::ProgramsJson(built);
//   // [{"bytes": 9128, "kernels": ["_Z..."], "key": "f14a...", "origin": "compiled",
//   //   "path": "/home/u/.cache/kjit/f14a....kjit", "program": "rms_norm"}]
#pragma once

#include <nlohmann/json.hpp>

#include "kjit/runtime.h"

namespace kjit::internal {

// BuildInfo::programs: [{"program", "key", "origin", "path", "bytes", "kernels"}, ...].
nlohmann::json ProgramsJson(const BuildInfo& built);

}  // namespace kjit::internal
