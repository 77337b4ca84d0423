#include "jit/dtype.h"

#include "kjit/tensor.h"

#include <fmt/format.h>

#include "jit/printable.h"

namespace kjit {

size_t SizeOf(DType t) { return t == DType::kF32 ? 4 : 2; }

const char* Name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kF16: return "fp16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

const char* DeviceTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "float";
    case DType::kF16: return "kjit::f16";
    case DType::kBF16: return "kjit::bf16";
  }
  return "?";
}

absl::Status CheckDTypesOnTarget(
    const jit::Target& target,
    std::initializer_list<std::pair<std::string_view, std::optional<DType>>> fields) {
  constexpr int kMinBf16Arch = 80;  // cvt.rn.bf16.f32 and the .bf16 types of PTX
  for (const auto& [field, t] : fields) {
    if (t == DType::kBF16 && target.arch < kMinBf16Arch) {
      return absl::InvalidArgumentError(
          fmt::format("{}: bf16 needs sm_{} or newer, the target is {}; use fp16 or fp32", field,
                      kMinBf16Arch, target.ToString()));
    }
  }
  return absl::OkStatus();
}

const char* Name(IndexType t) { return t == IndexType::kInt32 ? "int32" : "int64"; }
size_t SizeOf(IndexType t) { return t == IndexType::kInt32 ? 4 : 8; }

absl::StatusOr<DType> ParseDType(std::string_view text) {
  if (text == "fp32" || text == "f32" || text == "float32" || text == "float") return DType::kF32;
  if (text == "fp16" || text == "f16" || text == "float16" || text == "half") return DType::kF16;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(
      fmt::format("dtype: {} is not supported; expected fp32, fp16 or bf16", jit::Quoted(text)));
}

}  // namespace kjit
