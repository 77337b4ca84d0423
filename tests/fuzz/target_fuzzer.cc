// libFuzzer target for ParseTarget (jit/target.h): the CLI's --arch values, Runtime::Options'
// target string and the target field of every cache entry's metadata.
//
// Invariants: success or InvalidArgument only; a parsed target's ToString() re-parses to the same
// Target and is one of the canonical spellings (re-printing it is a fixpoint).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "jit/target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kjit::jit::Target> t = kjit::jit::ParseTarget(text);
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (t->arch < 50 || t->arch > 999) std::abort();
  const std::string s = t->ToString();
  absl::StatusOr<kjit::jit::Target> again = kjit::jit::ParseTarget(s);
  if (!again.ok() || !(*again == *t) || again->ToString() != s) std::abort();
  if (t->GpuArchitectureOption() != "--gpu-architecture=" + s) std::abort();
  return 0;
}
