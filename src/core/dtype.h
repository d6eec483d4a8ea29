// Element types of checkpoint tensors and the scalar conversions the kernels build on.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace nextn {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  F8_E4M3,  // float8_e4m3fn: no inf, NaN = 0x7f/0xff
  F8_E8M0,  // float8_e8m0fnu: pure power-of-two exponent (FP8 block scales, "ue8m0")
  U8,
  I8,
  I32,
  I64,
  F64,
  BOOL,
};

size_t dtype_size(DType t);
// safetensors spelling ("F32", "BF16", "F8_E4M3", "F8_E8M0", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype string; returns false for an unknown one.
bool parse_dtype(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even, NaN preserved (what torch's .to(bfloat16) does).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t v);
float fp8_e4m3_to_f32(uint8_t v);
// The nearest e4m3fn code of f (ties to the even code), saturated to ±448 (e4m3fn has no inf); NaN -> 0x7f.
uint8_t f32_to_fp8_e4m3(float f);
// E8M0: value = 2^(v - 127); 0xff is NaN.
float e8m0_to_f32(uint8_t v);

// Converts n elements of type t at src into f32 (only float types and integer types that fit).
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace nextn
