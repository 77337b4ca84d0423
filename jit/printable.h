// Text from outside kjit (a config.json, a spec's JSON, a cache entry's parameters, a flag, an
// environment variable, a path) made safe to print: its control characters would otherwise reach
// the terminal raw (an ESC sequence clears the screen, retitles the window or hides what follows),
// and a NUL would cut a C caller's copy of the message. Printable escapes each control character
// (C0, DEL, and C1 as UTF-8: \n, \t, \x1b, \u009b) and each byte that is not valid UTF-8 (\xe9),
// and keeps the rest, printable UTF-8 included. Quoted is for echoing a value in a message: it
// also escapes `"` and `\`, cuts the value to `max` bytes (saying how long it was) and quotes it.
//
//   fmt::print("{} ({})\n", jit::Printable(config_path), ...);
//   return absl::InvalidArgumentError(fmt::format("reduction: {} is not ...", jit::Quoted(text)));
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kjit::jit {

std::string Printable(std::string_view text);
// Printable, line by line: a message's own line breaks stay ("...\nfix: ...").
std::string PrintableLines(std::string_view text);

// "\"mean\\u0000x\"", or "\"aaaa...\" (100000 bytes)" when cut.
std::string Quoted(std::string_view text, size_t max = 64);

}  // namespace kjit::jit
