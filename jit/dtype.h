// The device side of kjit's element types (kjit/dtype.h): their spelling in the templates, and the
// archs the templates compile them for.
//
//   std::string dev = DeviceTypeName(DType::kBF16);   // "kjit::bf16"
//   KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(target, {{"dtype", spec.dtype}}));
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>
#include <utility>

#include "jit/target.h"
#include "kjit/dtype.h"

namespace kjit {

const char* DeviceTypeName(DType t);  // "float", "kjit::f16", "kjit::bf16"

// OK when the templates compile each dtype given for `target` (bf16's conversions need sm_80),
// else InvalidArgument naming the first field that does not, before any compile: "dtype: bf16
// needs sm_80 or newer, the target is sm_75; use fp16 or fp32". Unset fields are skipped.
absl::Status CheckDTypesOnTarget(
    const jit::Target& target,
    std::initializer_list<std::pair<std::string_view, std::optional<DType>>> fields);

}  // namespace kjit
