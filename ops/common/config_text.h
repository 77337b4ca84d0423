// Reads a launch config back from the text its ToString() prints ("vec=8 threads=512 ..."), as the
// tuning database stores it: space-separated name=value fields, each required exactly once, in any
// order. Shared by the op configs' parsers (cross_entropy_config.h, rms_norm_config.h) so that they
// reject bad text with the same kind of message.
//
//   KJIT_ASSIGN_OR_RETURN(ConfigText t, ConfigText::Split("cross-entropy config", text, {"vec"}));
//   KJIT_ASSIGN_OR_RETURN(int vec, t.Int("vec"));
//   if (vec > 16) return t.Invalid("vec", "at most 16");
//   // InvalidArgument: cross-entropy config "vec=32": vec=32: expected at most 16
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "kjit/status.h"

namespace kjit::ops {

class ConfigText {
 public:
  // `what` names the config in errors. InvalidArgument naming the text and the field for a token
  // that is not name=value, a field not in `names`, one given twice, or one missing.
  static absl::StatusOr<ConfigText> Split(std::string_view what, std::string_view text,
                                          std::initializer_list<std::string_view> names);

  // The value of one of the names given to Split.
  std::string_view Value(std::string_view name) const;
  // The value as a decimal int, or InvalidArgument naming the field.
  absl::StatusOr<int> Int(std::string_view name) const;
  // InvalidArgument: `<what> "<text>": <name>=<value>: expected <expected>`.
  absl::Status Invalid(std::string_view name, std::string_view expected) const;

 private:
  ConfigText() = default;
  absl::Status Error(std::string_view problem) const;
  std::string what_;
  std::string text_;
  std::map<std::string, std::string, std::less<>> fields_;
};

// A whole decimal int (an optional '-' and digits, nothing else), or nullopt.
std::optional<int> ParseInt(std::string_view text);

constexpr bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace kjit::ops
