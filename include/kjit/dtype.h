// Element types kjit kernels are specialized for.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::DType t, kjit::ParseDType("bf16"));
//   size_t bytes = kjit::SizeOf(t) * n;   // 2 * n
#pragma once

#include <cstddef>
#include <string_view>

#include "kjit/status.h"

namespace kjit {

// bf16 needs sm_80 or newer: an op of it for an older target is refused as it is made
// (InvalidArgument naming the field).
enum class DType { kF32, kF16, kBF16 };

size_t SizeOf(DType t);
const char* Name(DType t);  // "fp32", "fp16", "bf16"
// Accepts fp32/f32/float32, fp16/f16/float16/half, bf16/bfloat16; InvalidArgument otherwise.
absl::StatusOr<DType> ParseDType(std::string_view text);

}  // namespace kjit
