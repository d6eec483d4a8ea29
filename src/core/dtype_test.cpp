#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace nextn {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Bit-exact equality (distinguishes -0 from +0); any NaN equals any NaN.
::testing::AssertionResult same_float(float got, float want) {
  if (std::isnan(got) && std::isnan(want)) return ::testing::AssertionSuccess();
  if (bits_of(got) == bits_of(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << " (0x" << std::hex << bits_of(got)
                                       << "), want " << want << " (0x" << bits_of(want) << ")";
}

TEST(DType, SizesNamesAndParsing) {
  struct Case {
    DType t;
    const char* name;
    size_t size;
  };
  const Case cases[] = {
      {DType::F64, "F64", 8},   {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
      {DType::BF16, "BF16", 2}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1},
      {DType::U8, "U8", 1},     {DType::I8, "I8", 1},           {DType::I32, "I32", 4},
      {DType::I64, "I64", 8},   {DType::BOOL, "BOOL", 1},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(dtype_size(c.t), c.size) << c.name;
    EXPECT_STREQ(dtype_name(c.t), c.name);
    DType parsed = DType::BOOL;
    if (c.t == DType::BOOL) parsed = DType::F32;
    ASSERT_TRUE(parse_dtype(c.name, &parsed)) << c.name;
    EXPECT_EQ(parsed, c.t) << c.name;
  }
  for (const char* bad : {"", "f32", "F8_E5M2", "FLOAT", "I16", "U64", "F32 ", "BF16x"}) {
    DType out = DType::I8;
    EXPECT_FALSE(parse_dtype(bad, &out)) << bad;
    EXPECT_EQ(out, DType::I8) << "parse_dtype must not touch *out on failure: " << bad;
  }
}

// IEEE half: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Reference via std::ldexp in double.
float f16_reference(uint16_t v) {
  const int sign = v >> 15, exp = (v >> 10) & 0x1f, mant = v & 0x3ff;
  double mag;
  if (exp == 0x1f) {
    mag = mant == 0 ? std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<double>(mant), -24);
  } else {
    mag = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return static_cast<float>(sign ? -mag : mag);
}

TEST(DType, F16AllCodes) {
  for (uint32_t v = 0; v <= 0xffff; ++v) {
    EXPECT_TRUE(
        same_float(f16_to_f32(static_cast<uint16_t>(v)), f16_reference(static_cast<uint16_t>(v))))
        << "f16 code 0x" << std::hex << v;
  }
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x0200), std::ldexp(1.0f, -15));
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(bits_of(f16_to_f32(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(bits_of(f16_to_f32(0x0000)), 0u);
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xfe00)));
}

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf; S.1111.111 is NaN.
float fp8_e4m3_reference(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 0xf, mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)             // mant/8 * 2^-6
                             : std::ldexp(static_cast<float>(8 + mant), exp - 10);  // 1.m * 2^(e-7)
  return sign ? -mag : mag;
}

TEST(DType, Fp8E4M3AllCodes) {
  for (int v = 0; v < 256; ++v) {
    EXPECT_TRUE(same_float(fp8_e4m3_to_f32(static_cast<uint8_t>(v)),
                           fp8_e4m3_reference(static_cast<uint8_t>(v))))
        << "fp8 code 0x" << std::hex << v;
  }
}

TEST(DType, Fp8E4M3KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);  // max finite
  EXPECT_EQ(fp8_e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);   // 2^-9, smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7.0f / 512.0f);  // largest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0.015625f);      // 2^-6, smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(bits_of(fp8_e4m3_to_f32(0x80)), 0x80000000u);
  EXPECT_EQ(bits_of(fp8_e4m3_to_f32(0x00)), 0u);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  // 0x78..0x7e are finite (the fn variant has no infinities).
  for (int v = 0x78; v <= 0x7e; ++v)
    EXPECT_TRUE(std::isfinite(fp8_e4m3_to_f32(static_cast<uint8_t>(v))));
}

// Every code round-trips, and every value between two neighbouring codes goes to the nearer (a tie to the even
// code): checked at the midpoints and one float to either side of them, for both signs, across the range.
TEST(DType, Fp8E4M3EncodesToTheNearestCodeTiesToEven) {
  for (int c = 0; c < 0x7f; ++c)
    for (uint8_t sign : {uint8_t(0x00), uint8_t(0x80)}) {
      const uint8_t code = static_cast<uint8_t>(sign | c);
      EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(code)), code) << "code 0x" << std::hex << int(code);
      if (c == 0x7e) continue;
      const float lo = fp8_e4m3_to_f32(code), hi = fp8_e4m3_to_f32(static_cast<uint8_t>(code + 1));
      const float mid = (lo + hi) / 2;  // (exact: both are short binary fractions)
      const uint8_t even = (c & 1) == 0 ? code : static_cast<uint8_t>(code + 1);
      EXPECT_EQ(f32_to_fp8_e4m3(mid), even) << "midpoint after 0x" << std::hex << int(code);
      EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, lo)), code) << "below the midpoint after 0x" << std::hex
                                                                 << int(code);
      EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(mid, hi)), code + 1) << "above the midpoint after 0x" << std::hex
                                                                     << int(code);
    }
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);  // saturates (no inf code)
  EXPECT_EQ(f32_to_fp8_e4m3(-470.0f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-11f), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(DType, E8M0AllCodes) {
  for (int v = 0; v < 255; ++v) {
    EXPECT_TRUE(same_float(e8m0_to_f32(static_cast<uint8_t>(v)), std::ldexp(1.0f, v - 127)))
        << "e8m0 code " << v;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(126), 0.5f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_GT(e8m0_to_f32(0), 0.0f);  // 2^-127: an f32 subnormal, not flushed to zero
}

TEST(DType, Bf16DecodeAllCodes) {
  for (uint32_t v = 0; v <= 0xffff; ++v) {
    const int sign = v >> 15, exp = (v >> 7) & 0xff, mant = v & 0x7f;
    double mag;
    if (exp == 0xff) {
      mag = mant == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
    } else if (exp == 0) {
      mag = std::ldexp(static_cast<double>(mant), -133);
    } else {
      mag = std::ldexp(static_cast<double>(128 + mant), exp - 134);
    }
    const float want = static_cast<float>(sign ? -mag : mag);
    EXPECT_TRUE(same_float(bf16_to_f32(static_cast<uint16_t>(v)), want))
        << "bf16 code 0x" << std::hex << v;
  }
}

TEST(DType, Bf16RoundingTiesToEven) {
  // Exactly halfway: round to the even bf16 mantissa.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // 1 + 2^-8 -> 1.0 (even)
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, odd below -> rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf808000u)), 0xbf80);  // negative tie -> even
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);
  // Just above / below halfway.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f81ffffu)), 0x3f82);
  // Exact values are kept.
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xc020);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  // Mantissa carry into the exponent, and overflow to infinity.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3fff8000u)), 0x4000);  // tie, odd 0x3fff -> 2.0 (carry)
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  // NaN stays NaN (signalling payloads are quieted, not rounded into infinity).
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xffffffffu)))));
  // Round trip of every finite bf16 through f32 is the identity.
  for (uint32_t v = 0; v <= 0xffff; ++v) {
    if (((v >> 7) & 0xff) == 0xff && (v & 0x7f)) continue;  // NaN
    EXPECT_EQ(f32_to_bf16(bf16_to_f32(static_cast<uint16_t>(v))), v);
  }
  EXPECT_EQ(round_to_bf16(from_bits(0x3f808001u)), bf16_to_f32(0x3f81));
}

TEST(DType, ConvertToF32EveryType) {
  float out[4];
  {
    const float in[4] = {1.5f, -0.0f, 3e38f, -7.25f};
    convert_to_f32(DType::F32, in, out, 4);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(same_float(out[i], in[i]));
  }
  {
    const double in[4] = {0.1, -2.0, 1e300, 65536.5};
    convert_to_f32(DType::F64, in, out, 4);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(same_float(out[i], static_cast<float>(in[i])));
  }
  {
    const uint16_t in[4] = {0x3c00, 0x0001, 0xfc00, 0x7bff};
    convert_to_f32(DType::F16, in, out, 4);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(same_float(out[i], f16_reference(in[i])));
  }
  {
    const uint16_t in[4] = {0x3f80, 0xc020, 0x0000, 0x7f80};
    convert_to_f32(DType::BF16, in, out, 4);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -2.5f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], std::numeric_limits<float>::infinity());
  }
  {
    const uint8_t in[4] = {0x38, 0x7e, 0x81, 0xfe};
    convert_to_f32(DType::F8_E4M3, in, out, 4);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], 448.0f);
    EXPECT_EQ(out[2], -0.001953125f);
    EXPECT_EQ(out[3], -448.0f);
  }
  {
    const uint8_t in[4] = {127, 130, 120, 0xff};
    convert_to_f32(DType::F8_E8M0, in, out, 4);
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], 8.0f);
    EXPECT_EQ(out[2], 1.0f / 128.0f);
    EXPECT_TRUE(std::isnan(out[3]));
  }
  {
    const uint8_t in[4] = {0, 1, 200, 255};
    convert_to_f32(DType::U8, in, out, 4);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[1], 1.0f);
    EXPECT_EQ(out[2], 200.0f);
    EXPECT_EQ(out[3], 255.0f);
  }
  {
    const int8_t in[4] = {-128, -1, 0, 127};
    convert_to_f32(DType::I8, in, out, 4);
    EXPECT_EQ(out[0], -128.0f);
    EXPECT_EQ(out[1], -1.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 127.0f);
  }
  {
    const int32_t in[4] = {-2147483647 - 1, -5, 16777216, 123456};
    convert_to_f32(DType::I32, in, out, 4);
    EXPECT_EQ(out[0], -2147483648.0f);
    EXPECT_EQ(out[1], -5.0f);
    EXPECT_EQ(out[2], 16777216.0f);
    EXPECT_EQ(out[3], 123456.0f);
  }
  {
    const int64_t in[4] = {-1, 0, int64_t{1} << 40, 151643};
    convert_to_f32(DType::I64, in, out, 4);
    EXPECT_EQ(out[0], -1.0f);
    EXPECT_EQ(out[1], 0.0f);
    EXPECT_EQ(out[2], std::ldexp(1.0f, 40));
    EXPECT_EQ(out[3], 151643.0f);
  }
  {
    const uint8_t in[4] = {0, 1, 0, 1};
    convert_to_f32(DType::BOOL, in, out, 4);
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[1], 1.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 1.0f);
  }
}

TEST(DType, ConvertToF32UnalignedSource) {
  // Sources inside mmap'd files need not be aligned: decode from an odd address.
  alignas(8) uint8_t buf[1 + 3 * 8] = {};
  const int64_t vals[3] = {7, -9, 1000};
  std::memcpy(buf + 1, vals, sizeof(vals));
  float out[3];
  convert_to_f32(DType::I64, buf + 1, out, 3);
  EXPECT_EQ(out[0], 7.0f);
  EXPECT_EQ(out[1], -9.0f);
  EXPECT_EQ(out[2], 1000.0f);
  convert_to_f32(DType::F32, buf + 1, out, 0);  // n == 0 is a no-op
}

TEST(TensorView, ShapeStr) {
  TensorView t;
  EXPECT_EQ(t.shape_str(), "[]");
  t.shape = {7};
  EXPECT_EQ(t.shape_str(), "[7]");
  t.shape = {2, 3};
  EXPECT_EQ(t.shape_str(), "[2, 3]");
  t.shape = {1, 0, 151936};
  EXPECT_EQ(t.shape_str(), "[1, 0, 151936]");
  EXPECT_EQ(t.numel(), 0);
}

}  // namespace
}  // namespace nextn
