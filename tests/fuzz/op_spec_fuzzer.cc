// libFuzzer target for SpecFromJson (ops/registry.h): the op spec `kjit-tune --spec` takes from a
// user or from a runtime with KJIT_AUTOTUNE, and the one a tuner's worker reads.
//
// Invariants: success or InvalidArgument only; a parsed spec's JSON (SpecToJson) parses back to a
// spec with the same JSON (every value it holds is one the parser accepts).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ops/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kjit::ops::OpSpec> op = kjit::ops::SpecFromJson(text);
  if (!op.ok()) {
    if (op.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string json = kjit::ops::SpecToJson(*op);
  absl::StatusOr<kjit::ops::OpSpec> again = kjit::ops::SpecFromJson(json);
  if (!again.ok() || again->index() != op->index() || kjit::ops::SpecToJson(*again) != json) {
    std::abort();
  }
  if (kjit::ops::TuningShape(*op).empty()) std::abort();
  return 0;
}
