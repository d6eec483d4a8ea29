#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace nextn {

namespace {

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},         {DType::F16, "F16", 2},         {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1}, {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},           {DType::I32, "I32", 4},         {DType::I64, "I64", 8},
    {DType::F64, "F64", 8},         {DType::BOOL, "BOOL", 1},
};

const DTypeInfo& info(DType t) {
  for (const DTypeInfo& d : kDTypes)
    if (d.type == t) return d;
  throw Error("invalid dtype value " + std::to_string(static_cast<int>(t)));
}

template <typename T>
void cast_all(const void* src, float* dst, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(v);
  }
}

template <typename T, float (*Fn)(T)>
void decode_all(const void* src, float* dst, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    dst[i] = Fn(v);
  }
}

}  // namespace

size_t dtype_size(DType t) { return info(t).size; }

const char* dtype_name(DType t) { return info(t).name; }

bool parse_dtype(std::string_view s, DType* out) {
  for (const DTypeInfo& d : kDTypes) {
    if (s == d.name) {
      if (out) *out = d.type;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x8000u) << 16;
  const uint32_t exp = (v >> 10) & 0x1fu;
  uint32_t mant = v & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    // Inf / NaN: keep the payload (shifted into the f32 mantissa).
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal f16: value = mant * 2^-24. Normalise into an f32 normal.
    int e = 127 - 15 + 1;  // exponent of 2^-14 in f32 bias
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3ffu;
    bits = sign | (static_cast<uint32_t>(e) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float fp8_e4m3_to_f32(uint8_t v) {
  const bool neg = (v & 0x80u) != 0;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  float mag;
  if (exp == 0xf && mant == 0x7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * (1.0f / 512.0f);  // mant/8 * 2^(1-7)
  } else {
    // (1 + mant/8) * 2^(exp-7), computed exactly with integer scaling.
    const float m = static_cast<float>(8 + mant);
    const int e = exp - 7 - 3;
    mag = e >= 0 ? m * static_cast<float>(1u << e) : m / static_cast<float>(1u << -e);
  }
  return neg ? -mag : mag;
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // (464 and up would round to 480, which e4m3fn lacks: saturate)
  if (a < 0x1p-6f) {  // subnormal codes: multiples of 2^-9 (0x08 is 2^-6, the smallest normal)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // (exact scaling; ties to even)
  }
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  bits += 0x7ffffu + ((bits >> 20) & 1u);  // round the mantissa to 3 bits, ties to even (may carry into e)
  const uint32_t e = (bits >> 23) - 127 + 7, m = (bits >> 20) & 7u;
  return sign | static_cast<uint8_t>(std::min<uint32_t>((e << 3) | m, 0x7e));
}

float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  if (v == 0) {
    // 2^-127 is an f32 subnormal: mantissa bit 22 set, exponent field 0.
    const uint32_t bits = 0x00400000u;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const uint32_t bits = static_cast<uint32_t>(v) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  if (n == 0) return;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::F16:
      decode_all<uint16_t, f16_to_f32>(src, dst, n);
      return;
    case DType::BF16:
      decode_all<uint16_t, bf16_to_f32>(src, dst, n);
      return;
    case DType::F8_E4M3:
      decode_all<uint8_t, fp8_e4m3_to_f32>(src, dst, n);
      return;
    case DType::F8_E8M0:
      decode_all<uint8_t, e8m0_to_f32>(src, dst, n);
      return;
    case DType::U8:
      cast_all<uint8_t>(src, dst, n);
      return;
    case DType::I8:
      cast_all<int8_t>(src, dst, n);
      return;
    case DType::I32:
      cast_all<int32_t>(src, dst, n);
      return;
    case DType::I64:
      cast_all<int64_t>(src, dst, n);
      return;
    case DType::F64:
      cast_all<double>(src, dst, n);
      return;
    case DType::BOOL: {
      const unsigned char* p = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = p[i] != 0 ? 1.0f : 0.0f;
      return;
    }
  }
  throw Error("convert_to_f32: invalid dtype value " + std::to_string(static_cast<int>(t)));
}

}  // namespace nextn
