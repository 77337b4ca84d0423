// JSON text that never throws on the strings kjit did not make. nlohmann's dump() throws
// type_error 316 on invalid UTF-8, and paths, device names, environment variables and compiler logs
// are bytes, not UTF-8 (KJIT_CACHE_DIR=/tmp/caf$'\xe9' is a valid directory): such a byte becomes
// U+FFFD instead. Use these wherever JSON is written from a value holding an external string.
//
//   fmt::print("{}\n", jit::JsonText(report, 2));      // instead of report.dump(2)
//   report_ = jit::WithValidUtf8(report_);             // a value someone else will dump()
//   entry["error"] = jit::ValidUtf8(status.message());  // one string
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kjit::jit {

// j.dump(indent), with invalid UTF-8 written as U+FFFD rather than thrown.
template <class BasicJson>
std::string JsonText(const BasicJson& j, int indent = -1) {
  return j.dump(indent, ' ', false, BasicJson::error_handler_t::replace);
}

// The same value with every string made valid UTF-8 as JsonText writes it, for a value that code
// outside one's control dumps with a plain dump().
template <class BasicJson>
BasicJson WithValidUtf8(const BasicJson& j) {
  return BasicJson::parse(JsonText(j));
}

// `text` with each invalid UTF-8 sequence replaced by U+FFFD, as JsonText writes it.
inline std::string ValidUtf8(std::string_view text) {
  return WithValidUtf8(nlohmann::json(std::string(text))).get<std::string>();
}

}  // namespace kjit::jit
