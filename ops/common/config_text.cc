#include "ops/common/config_text.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "jit/printable.h"

namespace kjit::ops {

absl::StatusOr<ConfigText> ConfigText::Split(std::string_view what, std::string_view text,
                                             std::initializer_list<std::string_view> names) {
  ConfigText t;
  t.what_ = what;
  t.text_ = text;
  while (!text.empty()) {
    const size_t space = text.find(' ');
    const std::string_view token = text.substr(0, space);
    text.remove_prefix(space == std::string_view::npos ? text.size() : space + 1);
    if (token.empty()) continue;  // a run of spaces
    const size_t eq = token.find('=');
    if (eq == std::string_view::npos) {
      return t.Error(fmt::format("{} is not name=value", jit::Quoted(token)));
    }
    const std::string_view name = token.substr(0, eq);
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return t.Error(
          fmt::format("unknown field {}; expected {}", jit::Quoted(name), fmt::join(names, ", ")));
    }
    if (!t.fields_.emplace(name, token.substr(eq + 1)).second) {
      return t.Error(fmt::format("field {} appears twice", jit::Quoted(name)));
    }
  }
  for (std::string_view name : names) {
    if (!t.fields_.contains(name)) return t.Error(fmt::format("field \"{}\" is missing", name));
  }
  return t;
}

std::string_view ConfigText::Value(std::string_view name) const {
  auto it = fields_.find(name);
  return it == fields_.end() ? std::string_view{} : std::string_view(it->second);
}

absl::StatusOr<int> ConfigText::Int(std::string_view name) const {
  std::optional<int> v = ParseInt(Value(name));
  if (!v) return Invalid(name, "a whole number");
  return *v;
}

absl::Status ConfigText::Invalid(std::string_view name, std::string_view expected) const {
  // The whole text is quoted before: the value is shown as typed, escaped and cut short.
  constexpr size_t kMax = 64;
  const std::string_view value = Value(name);
  return Error(fmt::format("{}={}{}: expected {}", name, jit::Printable(value.substr(0, kMax)),
                           value.size() > kMax ? "..." : "", expected));
}

absl::Status ConfigText::Error(std::string_view problem) const {
  return absl::InvalidArgumentError(fmt::format("{} {}: {}", what_, jit::Quoted(text_), problem));
}

std::optional<int> ParseInt(std::string_view text) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || stop != end) return std::nullopt;
  return v;
}

}  // namespace kjit::ops
