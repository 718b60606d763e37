// Fuzzes IndexedDataset::Open and reads: input = 2 bytes of .bin size (little-endian) + the .idx.
// Whatever the bytes, Open either fails with a status or yields a dataset whose every sequence
// can be read without leaving the maps (ASan checks that under libFuzzer).
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "libdata/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const std::string dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("leantron_fuzz_idx_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  const std::string prefix = dir + "/ds";
  uint16_t bin_size;
  std::memcpy(&bin_size, data, 2);
  {
    std::ofstream idx(prefix + ".idx", std::ios::binary | std::ios::trunc);
    idx.write(reinterpret_cast<const char*>(data + 2), static_cast<std::streamsize>(size - 2));
    std::ofstream bin(prefix + ".bin", std::ios::binary | std::ios::trunc);
    const std::string bytes(bin_size, '\x5a');
    bin.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto ds = leantron::data::IndexedDataset::Open(prefix);
  if (!ds.ok()) return 0;
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < ds->num_sequences(); ++i) {
    tokens.clear();
    // Floating-point files may hold values that are no token: an error, never a crash.
    const bool floating = ds->dtype() == leantron::data::DType::kFloat32 ||
                          ds->dtype() == leantron::data::DType::kFloat64;
    if (!ds->ReadTokens(i, &tokens).ok() && !floating) __builtin_trap();
  }
  for (int64_t d = 0; d <= ds->num_documents(); ++d) (void)ds->document_index(d);
  return 0;
}
