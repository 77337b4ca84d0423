// kjit's own status helpers, beside the installed kjit/status.h and not installed with it: users
// need none of them. Debian's Abseil (20220623) is built with its own absl::string_view, so code
// that passes a status's message on converts it once here; Annotate adds context to an error.
//
//   KJIT_RETURN_IF_ERROR(Annotate(jit::MakePrivateDirs(dir), "tuning db"));  // "tuning db: ..."
//   fmt::print(stderr, "kjit: {}\n", ToStd(status.message()));
#pragma once

#include <string>
#include <string_view>

#include "kjit/status.h"

namespace kjit {

inline std::string_view ToStd(absl::string_view s) { return {s.data(), s.size()}; }
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

// Prefixes a status's message with context, keeping its code.
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), std::string(context) + ": " + std::string(ToStd(s.message())));
}

}  // namespace kjit

// Pastes two tokens after expanding them: KJIT_CONCAT(name_, __LINE__).
#define KJIT_CONCAT_INNER(a, b) a##b
#define KJIT_CONCAT(a, b) KJIT_CONCAT_INNER(a, b)
