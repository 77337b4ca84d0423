// libFuzzer target for ParseDType (jit/dtype.h): the CLI's --dtype / --weight-dtype values.
//
// Invariants: success or InvalidArgument only; a parsed dtype's Name() re-parses to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "jit/dtype.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kjit::DType> t = kjit::ParseDType(text);
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  absl::StatusOr<kjit::DType> again = kjit::ParseDType(kjit::Name(*t));
  if (!again.ok() || *again != *t) std::abort();
  if (kjit::SizeOf(*t) != 2 && kjit::SizeOf(*t) != 4) std::abort();
  return 0;
}
