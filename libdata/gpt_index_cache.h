// On-disk cache of a GPTDataset's index arrays: one file per configuration, named by a hash of a
// key string that describes everything the arrays depend on. The full key is stored in the file
// and compared on load, so a hash collision or a stale file is a miss, never wrong data; so is a
// damaged file, by an XXH3-64 checksum of the arrays (and GptDataset checks every index is in
// range before using them). Arrays are 8-byte aligned in the file so they can be used in place
// from a memory map.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libdata/mapped_file.h"

namespace leantron::data {

struct GptIndices;

struct MappedGptIndices {
  MappedFile file;
  absl::Span<const int32_t> document_index;
  absl::Span<const int64_t> sample_index;
  absl::Span<const int64_t> shuffle_index;
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
};

// 64-bit FNV-1a, for cache file names (stable across runs and machines, unlike absl::Hash).
uint64_t StableHash64(absl::string_view bytes);

// Returns the mapped arrays if `path` is a complete cache file for `key`, nullopt otherwise.
std::optional<MappedGptIndices> LoadGptIndexCache(const std::string& path, const std::string& key);
// Writes the cache atomically (temporary file, then rename).
absl::Status SaveGptIndexCache(const std::string& path, const std::string& key,
                               const GptIndices& indices);

}  // namespace leantron::data
