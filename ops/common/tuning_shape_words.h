// A tuning record's shape field ("vocab=128256 softcap") split back into its words: "key=value"
// words and flag words. Each op's tuning key (ops/<op>/tuning_key.h) reads its specs back from
// them; the registry checks the round trip through the key, so a reader need not refuse every
// odd word itself.
//
//   TuningShapeWords w = TuningShapeWords::Parse("vocab=128256 softcap");
//   w.Int("vocab");     // 128256
//   w.Has("softcap");   // true
#pragma once

#include <charconv>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>

namespace kjit::ops {

struct TuningShapeWords {
  std::map<std::string, std::string, std::less<>> values;
  std::set<std::string, std::less<>> flags;

  static TuningShapeWords Parse(std::string_view shape) {
    TuningShapeWords w;
    while (!shape.empty()) {
      const size_t space = shape.find(' ');
      const std::string_view word = shape.substr(0, space);
      shape = space == std::string_view::npos ? "" : shape.substr(space + 1);
      if (const size_t eq = word.find('='); eq != std::string_view::npos) {
        w.values.emplace(word.substr(0, eq), word.substr(eq + 1));
      } else if (!word.empty()) {
        w.flags.emplace(word);
      }
    }
    return w;
  }
  bool Has(std::string_view flag) const { return flags.count(flag) > 0; }
  // The decimal integer under `key`, or 0 when there is none.
  int64_t Int(std::string_view key) const {
    auto it = values.find(key);
    int64_t n = 0;
    if (it == values.end()) return 0;
    const auto [end, ec] =
        std::from_chars(it->second.data(), it->second.data() + it->second.size(), n);
    return ec == std::errc() && end == it->second.data() + it->second.size() ? n : 0;
  }
};

}  // namespace kjit::ops
