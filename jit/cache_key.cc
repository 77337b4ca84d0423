#include "jit/cache_key.h"

#include <xxhash.h>

#include <fmt/format.h>

namespace kjit::jit {

std::string HashHex(const std::string& bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

std::string CacheKey(const Source& source, const Target& target,
                     const std::vector<std::string>& options, const std::string& nvrtc_version) {
  // Length-prefix every field so that no two different inputs serialize alike.
  std::string buf;
  auto field = [&buf](const std::string& s) {
    buf += std::to_string(s.size());
    buf += ':';
    buf += s;
  };
  field("kjit-cache-format-" + std::to_string(kCacheFormatVersion));
  field(target.ToString());
  field(nvrtc_version);
  for (const std::string& o : options) field(o);
  field(source.text);
  for (const auto& [name, text] : source.headers) {
    field(name);
    field(text);
  }
  for (const std::string& e : source.name_expressions) field(e);
  return HashHex(buf);
}

}  // namespace kjit::jit
