// The content address of a compiled program.
//
// Everything that can change the bytes NVRTC emits goes in: the stub, the text of every header it
// includes, the options, the exact NVRTC version, the target and kjit's cache-format version.
// Editing a template therefore changes the key, and old entries simply stop matching.
//
//   std::string key = CacheKey(source, target, CompileOptions(target),
//   nvrtc->version().ToString());
//   // "3f2a...": 32 hex digits of XXH3-128
#pragma once

#include <string>
#include <vector>

#include "jit/source.h"
#include "jit/target.h"

namespace kjit::jit {

// Bump when the entry layout or anything the key does not cover changes meaning. 2: the metadata
// records the entry's own key.
inline constexpr int kCacheFormatVersion = 2;

std::string CacheKey(const Source& source, const Target& target,
                     const std::vector<std::string>& options, const std::string& nvrtc_version);

// XXH3-128 of bytes as 32 lowercase hex digits.
std::string HashHex(const std::string& bytes);

}  // namespace kjit::jit
