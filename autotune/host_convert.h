// Host-side conversions between float and the 16-bit storage types, bit-exact with the device's
// cvt.rn (round to nearest even; NaN stays NaN). References and checks use them to produce inputs
// that are exactly representable and to decode outputs.
//
//   uint16_t b = FloatToBits(3.14f, DType::kBF16);
//   float back = BitsToFloat(b, DType::kBF16);     // 3.140625
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "jit/dtype.h"

namespace kjit::autotune {

float Bf16BitsToFloat(uint16_t bits);
uint16_t FloatToBf16Bits(float f);
float F16BitsToFloat(uint16_t bits);
uint16_t FloatToF16Bits(float f);

// Rounds a value to what storing it in `dtype` keeps.
double RoundTo(double v, DType dtype);

// Packs values (rounded to dtype) into the bytes a device buffer of that dtype holds, and back.
std::vector<unsigned char> Encode(const std::vector<double>& values, DType dtype);
std::vector<double> Decode(const std::vector<unsigned char>& bytes, DType dtype);

// n normal values of mean `offset` and deviation `scale`, each rounded to `dtype`: test inputs the
// device holds exactly.
std::vector<double> RandomValues(std::mt19937_64& rng, int64_t n, double scale, double offset,
                                 DType dtype);

}  // namespace kjit::autotune
