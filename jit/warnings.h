// The default warning sink of kjit: each distinct message once per process, on stderr, as
// "kjit: warning: <message>". Everything that warns goes through a sink (Runtime's
// RuntimeOptions::warnings, jit::Jit::Options::warn); this one is what they fall back to when given
// none, and what process-wide code configured from the environment before any Runtime exists (the
// tracer) reports through.
//
//   const auto& warn = options.warn ? options.warn : kjit::jit::WarnOnceToStderr;
//   warn("the cache directory is read-only; compiled kernels stay in memory");
#pragma once

#include <string_view>

namespace kjit::jit {

void WarnOnceToStderr(std::string_view message);

}  // namespace kjit::jit
