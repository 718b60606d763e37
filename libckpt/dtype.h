// Element types of safetensors files and the conversions the checkpoint tools need.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace leantron::ckpt {

// Every dtype the safetensors format names (spec §5). Sub-byte types (F4, F6_*) are sized in bits.
enum class DType : uint8_t {
  kBool,
  kF4,
  kF6E2M3,
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kF8E4M3Fnuz,
  kF8E5M2Fnuz,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};

// The name used in safetensors headers ("F32", "BF16", ...).
std::string_view DTypeName(DType dtype);
std::optional<DType> ParseDType(std::string_view name);
// Size of one element in bits (4 for F4, 6 for F6_*, 8 for U8, ...).
size_t DTypeBits(DType dtype);
// Byte size for whole-byte types; 0 for sub-byte types, which the tools only pass through.
size_t DTypeSize(DType dtype);

// IEEE half and bfloat16 conversions, round-to-nearest-even, NaN preserved as quiet NaN.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
inline uint16_t FloatToBFloat16(float f) {  // inline: hot loops (the offloaded optimizer)
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Reads element `i` of a float-typed buffer (F16, BF16, F32, F64) as double; used for norms.
std::optional<double> ElementAsDouble(DType dtype, const std::byte* data, size_t i);

}  // namespace leantron::ckpt
