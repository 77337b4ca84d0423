#include "kjit/host_convert.h"

#include <cmath>

#include <gtest/gtest.h>

namespace kjit {
namespace {

TEST(HostConvertTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Bf16BitsToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBf16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): up.
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(NAN))));
  EXPECT_EQ(Bf16BitsToFloat(FloatToBf16Bits(INFINITY)), INFINITY);
  EXPECT_EQ(Bf16BitsToFloat(FloatToBf16Bits(-3.140625f)), -3.140625f);
}

TEST(HostConvertTest, F16MatchesKnownEncodings) {
  EXPECT_EQ(FloatToF16Bits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16Bits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16Bits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16Bits(65520.0f), 0x7c00);               // rounds to infinity
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16Bits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: zero
  EXPECT_EQ(F16BitsToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16BitsToFloat(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(F16BitsToFloat(FloatToF16Bits(NAN))));
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even.
  EXPECT_EQ(FloatToF16Bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
}

TEST(HostConvertTest, EveryF16AndBf16ValueRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float h = F16BitsToFloat(bits);
    if (!std::isnan(h)) {
      ASSERT_EQ(FloatToF16Bits(h), bits) << std::hex << b;
    }
    const float g = Bf16BitsToFloat(bits);
    if (!std::isnan(g)) {
      ASSERT_EQ(FloatToBf16Bits(g), bits) << std::hex << b;
    }
  }
}

TEST(HostConvertTest, EncodeDecodeRoundTrip) {
  const std::vector<double> v = {0.0, 1.5, -2.25, 1e-3, 3.0e4};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const auto bytes = Encode(v, t);
    ASSERT_EQ(bytes.size(), v.size() * SizeOf(t));
    const auto back = Decode(bytes, t);
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(back[i], RoundTo(v[i], t)) << Name(t) << " " << i;
  }
}

}  // namespace
}  // namespace kjit
