// libFuzzer target for the $KJIT_CACHE_MAX_BYTES parser, reached the way kjit reaches it: through
// the environment and DiskCache::Options::FromEnvironment() (jit/disk_cache.cc).
//
// The input up to its first NUL becomes the variable's value (an environment string cannot hold
// one). Invariants: an empty value reads as unset (max_bytes stays the default); otherwise the
// value is accepted exactly when it is a whole decimal number that fits in 64 bits, and then
// max_bytes is that number; a rejection is InvalidArgument naming the variable.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "jit/disk_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string value(reinterpret_cast<const char*>(data), size);
  value = value.substr(0, value.find('\0'));
  // A fixed directory, so FromEnvironment never consults $HOME or the password database.
  setenv("KJIT_CACHE_DIR", "/nonexistent/kjit-fuzz", 1);
  setenv("KJIT_CACHE_MAX_BYTES", value.c_str(), 1);
  absl::StatusOr<kjit::jit::DiskCache::Options> o =
      kjit::jit::DiskCache::Options::FromEnvironment();

  bool digits = !value.empty();
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  uint64_t expected = 0;
  bool fits = false;
  if (digits) {
    errno = 0;
    expected = std::strtoull(value.c_str(), nullptr, 10);
    fits = errno != ERANGE;
  }
  if (value.empty()) {
    if (!o.ok() || o->max_bytes != kjit::jit::DiskCache::Options{}.max_bytes) std::abort();
  } else if (digits && fits) {
    if (!o.ok() || o->max_bytes != expected) std::abort();
  } else {
    if (o.ok() || o.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (std::string(o.status().message()).rfind("KJIT_CACHE_MAX_BYTES=", 0) != 0) std::abort();
  }
  if (o.ok() && o->dir != "/nonexistent/kjit-fuzz") std::abort();
  return 0;
}
