// Status macros for code that calls kjit: Debian's Abseil (20220623) has no RETURN_IF_ERROR-style
// macros, so this header supplies them once.
//
//   absl::StatusOr<Binary> Compile(const Source& src) {
//     KJIT_RETURN_IF_ERROR(CheckSource(src));
//     KJIT_ASSIGN_OR_RETURN(auto nvrtc, Nvrtc::Get());
//     ...
//   }
#pragma once

#include <utility>

#include <absl/status/status.h>
#include <absl/status/statusor.h>

// The temporary's name for KJIT_ASSIGN_OR_RETURN: one per line.
#define KJIT_ASSIGN_OR_RETURN_NAME_INNER_(line) kjit_statusor_##line
#define KJIT_ASSIGN_OR_RETURN_NAME_(line) KJIT_ASSIGN_OR_RETURN_NAME_INNER_(line)

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
  KJIT_ASSIGN_OR_RETURN_IMPL(KJIT_ASSIGN_OR_RETURN_NAME_(__LINE__), lhs, expr)
