// The device spelling of kjit's element types (kjit/dtype.h), as the templates name them.
//
//   std::string dev = DeviceTypeName(DType::kBF16);   // "kjit::bf16"
#pragma once

#include "kjit/dtype.h"

namespace kjit {

const char* DeviceTypeName(DType t);  // "float", "kjit::f16", "kjit::bf16"

}  // namespace kjit
