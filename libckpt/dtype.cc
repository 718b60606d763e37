#include "libckpt/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

namespace leantron::ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t bits;
};

constexpr std::array<DTypeInfo, 22> kDTypes = {{
    {DType::kBool, "BOOL", 8},
    {DType::kF4, "F4", 4},
    {DType::kF6E2M3, "F6_E2M3", 6},
    {DType::kF6E3M2, "F6_E3M2", 6},
    {DType::kU8, "U8", 8},
    {DType::kI8, "I8", 8},
    {DType::kF8E5M2, "F8_E5M2", 8},
    {DType::kF8E4M3, "F8_E4M3", 8},
    {DType::kF8E8M0, "F8_E8M0", 8},
    {DType::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {DType::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {DType::kI16, "I16", 16},
    {DType::kU16, "U16", 16},
    {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},
    {DType::kI32, "I32", 32},
    {DType::kU32, "U32", 32},
    {DType::kF32, "F32", 32},
    {DType::kC64, "C64", 64},
    {DType::kF64, "F64", 64},
    {DType::kI64, "I64", 64},
    {DType::kU64, "U64", 64},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

size_t DTypeBits(DType dtype) { return Info(dtype).bits; }

size_t DTypeSize(DType dtype) {
  size_t bits = Info(dtype).bits;
  return bits % 8 == 0 ? bits / 8 : 0;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: value = mantissa * 2^-24, exact in float.
    float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -value : value;
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {  // Inf or NaN.
    return sign | 0x7c00 | (abs_bits > 0x7f800000u ? 0x200 : 0);
  }
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00;  // Rounds to >= 65520: overflow to Inf.
  int exponent = static_cast<int>(abs_bits >> 23) - 127;
  if (exponent < -14) {
    // Subnormal or zero in half: scale to units of 2^-24 and round to nearest even.
    float scaled = std::ldexp(std::bit_cast<float>(abs_bits), 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t mantissa = abs_bits & 0x7fffffu;
  uint32_t half = (static_cast<uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) ++half;  // Carry may bump the exponent.
  return sign | static_cast<uint16_t>(half);
}

float BFloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

std::optional<double> ElementAsDouble(DType dtype, const std::byte* data, size_t i) {
  switch (dtype) {
    case DType::kF16: {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return HalfToFloat(v);
    }
    case DType::kBF16: {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return BFloat16ToFloat(v);
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, data + 8 * i, 8);
      return v;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace leantron::ckpt
