#include "kjit/host_convert.h"

#include <cmath>

namespace kjit {

namespace {
uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

float Bf16BitsToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBf16Bits(float f) {
  uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep sign, stay NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float F16BitsToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (man << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t FloatToF16Bits(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal range: multiples of 2^-24, nearest even
    const float q = std::nearbyint(std::ldexp(a, 24));
    return sign | static_cast<uint16_t>(q);
  }
  const uint32_t ua = FloatBits(a);
  uint32_t exp = (ua >> 23) - 112;
  uint32_t man = ua & 0x7fffff;
  uint32_t half = (exp << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

double RoundTo(double v, DType dtype) {
  const float f = static_cast<float>(v);
  switch (dtype) {
    case DType::kF32: return f;
    case DType::kBF16: return Bf16BitsToFloat(FloatToBf16Bits(f));
    case DType::kF16: return F16BitsToFloat(FloatToF16Bits(f));
  }
  return f;
}

std::vector<unsigned char> Encode(const std::vector<double>& values, DType dtype) {
  std::vector<unsigned char> out(values.size() * SizeOf(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::kF32) {
      std::memcpy(&out[i * 4], &f, 4);
    } else {
      const uint16_t b = dtype == DType::kBF16 ? FloatToBf16Bits(f) : FloatToF16Bits(f);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

std::vector<double> Decode(const std::vector<unsigned char>& bytes, DType dtype) {
  const size_t n = bytes.size() / SizeOf(dtype);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      out[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      out[i] = dtype == DType::kBF16 ? Bf16BitsToFloat(b) : F16BitsToFloat(b);
    }
  }
  return out;
}

}  // namespace kjit
