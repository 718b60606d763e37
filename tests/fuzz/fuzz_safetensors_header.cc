// Fuzzes the safetensors header parser with whole files. Any input must give a header or an error,
// never a crash or an out-of-bounds read. An accepted header must describe tensors that tile the
// data buffer, and writing it again with our writer must parse back to the same tensors and
// metadata.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "libckpt/safetensors.h"
#include "libckpt/safetensors_writer.h"

using leantron::ckpt::DTypeSize;
using leantron::ckpt::ParseSafetensorsHeader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto header = ParseSafetensorsHeader(file, "fuzz.safetensors");
  if (!header.ok()) return 0;
  uint64_t cursor = 0;
  for (const auto& info : header->tensors) {
    if (info.begin != cursor || info.end < info.begin) __builtin_trap();
    cursor = info.end;
  }
  if (header->data_start + cursor != size) __builtin_trap();

  std::vector<leantron::ckpt::TensorSpec> specs;
  for (const auto& info : header->tensors) {
    if (DTypeSize(info.dtype) == 0) return 0;  // Our writer only writes whole-byte dtypes.
    specs.push_back({info.name, info.dtype, info.shape});
  }
  std::vector<uint64_t> offsets;
  const std::string json =
      leantron::ckpt::BuildSafetensorsHeader(specs, header->metadata, &offsets);
  std::vector<std::byte> rebuilt(8 + json.size() + cursor);
  for (int i = 0; i < 8; ++i) {
    rebuilt[i] = static_cast<std::byte>((static_cast<uint64_t>(json.size()) >> (8 * i)) & 0xff);
  }
  std::memcpy(rebuilt.data() + 8, json.data(), json.size());
  auto again = ParseSafetensorsHeader(rebuilt, "rebuilt.safetensors");
  if (!again.ok() || again->tensors.size() != header->tensors.size() ||
      again->metadata.size() != header->metadata.size()) {
    __builtin_trap();
  }
  for (const auto& info : header->tensors) {
    bool found = false;
    for (const auto& other : again->tensors) {
      if (other.name == info.name) {
        found = other.dtype == info.dtype && other.shape == info.shape &&
                other.num_bytes() == info.num_bytes();
      }
    }
    if (!found) __builtin_trap();
  }
  return 0;
}
