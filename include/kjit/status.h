// Status helpers for kjit's boundaries.
//
// Debian's Abseil (20220623) has no RETURN_IF_ERROR-style macros and is built with its own
// absl::string_view, so this header supplies both once:
//
//   absl::StatusOr<Binary> Compile(const Source& src) {
//     KJIT_RETURN_IF_ERROR(CheckSource(src));
//     KJIT_ASSIGN_OR_RETURN(auto nvrtc, Nvrtc::Get());
//     ...
//   }
#pragma once

#include <string>
#include <string_view>

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

namespace kjit {

inline std::string_view ToStd(absl::string_view s) { return {s.data(), s.size()}; }
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

// Prefixes a status's message with context, keeping its code.
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), std::string(context) + ": " + std::string(ToStd(s.message())));
}

}  // namespace kjit

#define KJIT_CONCAT_INNER(a, b) a##b
#define KJIT_CONCAT(a, b) KJIT_CONCAT_INNER(a, b)

#define KJIT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status kjit_status_ = (expr);        \
    if (!kjit_status_.ok()) return kjit_status_; \
  } while (0)

#define KJIT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(*tmp)

#define KJIT_ASSIGN_OR_RETURN(lhs, expr) \
  KJIT_ASSIGN_OR_RETURN_IMPL(KJIT_CONCAT(kjit_statusor_, __LINE__), lhs, expr)
