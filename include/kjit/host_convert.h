// Host-side conversions between float and the 16-bit storage types, bit-exact with the device's
// cvt.rn (round to nearest even; NaN stays NaN): for programs that prepare inputs or read outputs
// of kjit's ops without a CUDA toolkit of their own, and for kjit's references and checks.
//
//   uint16_t b = kjit::FloatToBf16Bits(3.14f);
//   float back = kjit::Bf16BitsToFloat(b);                                  // 3.140625
//   std::vector<unsigned char> bytes = kjit::Encode({1.0, 2.5}, kjit::DType::kBF16);
#pragma once

#include <cstdint>
#include <vector>

#include "kjit/dtype.h"

namespace kjit {

float Bf16BitsToFloat(uint16_t bits);
uint16_t FloatToBf16Bits(float f);
float F16BitsToFloat(uint16_t bits);
uint16_t FloatToF16Bits(float f);

// Rounds a value to what storing it in `dtype` keeps.
double RoundTo(double v, DType dtype);

// Packs values (rounded to dtype) into the bytes a device buffer of that dtype holds, and back.
std::vector<unsigned char> Encode(const std::vector<double>& values, DType dtype);
std::vector<double> Decode(const std::vector<unsigned char>& bytes, DType dtype);

}  // namespace kjit
