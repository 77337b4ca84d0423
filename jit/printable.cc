#include "jit/printable.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::jit {

namespace {

// The length of the valid UTF-8 sequence at text[i] (1 to 4), or 0 when it is not one (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF).
size_t Utf8Length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b = byte(i);
  if (b < 0x80) return 1;
  size_t n = b >= 0xC2 && b <= 0xDF   ? 2
             : b >= 0xE0 && b <= 0xEF ? 3
             : b >= 0xF0 && b <= 0xF4 ? 4
                                      : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  }
  const uint8_t second = byte(i + 1);
  if ((b == 0xE0 && second < 0xA0) || (b == 0xED && second > 0x9F) ||
      (b == 0xF0 && second < 0x90) || (b == 0xF4 && second > 0x8F)) {
    return 0;
  }
  return n;
}

// text[i]'s character as printable text; `i` moves past it.
std::string Escaped(std::string_view text, size_t& i, bool quoting) {
  const auto b = static_cast<uint8_t>(text[i]);
  const size_t n = Utf8Length(text, i);
  if (n == 0) return fmt::format("\\x{:02x}", text[i++] & 0xFF);
  if (n == 2 && b == 0xC2 && static_cast<uint8_t>(text[i + 1]) < 0xA0) {  // C1: U+0080..U+009F
    const int c1 = text[i + 1] & 0xFF;
    i += 2;
    return fmt::format("\\u{:04x}", c1);
  }
  const std::string_view one = text.substr(i, n);
  i += n;
  if (n > 1) return std::string(one);
  switch (b) {
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '"': return quoting ? "\\\"" : "\"";
    case '\\': return quoting ? "\\\\" : "\\";
    default: return b < 0x20 || b == 0x7F ? fmt::format("\\x{:02x}", b) : std::string(one);
  }
}

std::string Escape(std::string_view text, bool quoting) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) out += Escaped(text, i, quoting);
  return out;
}

}  // namespace

std::string Printable(std::string_view text) { return Escape(text, /*quoting=*/false); }

std::string PrintableLines(std::string_view text) {
  std::string out;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    out += Printable(text.substr(start, end - start));
    if (end < text.size()) out += '\n';
    start = end + 1;
  }
  return out;
}

std::string Quoted(std::string_view text, size_t max) {
  if (text.size() <= max) return "\"" + Escape(text, /*quoting=*/true) + "\"";
  size_t cut = max;  // not inside a UTF-8 sequence
  while (cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("\"{}...\" ({} bytes)", Escape(text.substr(0, cut), /*quoting=*/true),
                     text.size());
}

}  // namespace kjit::jit
