// Element types kjit kernels are specialized for, with their host and device spellings.
//
//   KJIT_ASSIGN_OR_RETURN(DType t, ParseDType("bf16"));
//   size_t bytes = SizeOf(t) * n;          // 2 * n
//   std::string dev = DeviceTypeName(t);   // "kjit::bf16", as the templates name it
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "jit/status.h"

namespace kjit {

enum class DType { kF32, kF16, kBF16 };

size_t SizeOf(DType t);
const char* Name(DType t);            // "fp32", "fp16", "bf16"
const char* DeviceTypeName(DType t);  // "float", "kjit::f16", "kjit::bf16"
// Accepts fp32/f32/float32, fp16/f16/float16/half, bf16/bfloat16; InvalidArgument otherwise.
absl::StatusOr<DType> ParseDType(std::string_view text);

}  // namespace kjit
