// Streaming, atomic safetensors writer. The full tensor list is declared up front (the header holds
// every offset), then tensor data arrives one tensor at a time, in any order, or in pieces, so a
// caller never holds more than the tensor (or the piece) it is writing. The file appears under its
// final name only after Finish(). On request the header's "__metadata__" also holds each tensor's
// XXH3-64 checksum
// ("xxh3_64:<name>": 16 hex digits), filled in when the data is complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/dtype.h"
#include "libfs/atomic_file.h"

struct XXH3_state_s;  // xxhash.h's streaming state

namespace leantron::ckpt {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;

  uint64_t num_bytes() const;  // Whole-byte dtypes.
};

using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

// The "__metadata__" key of a tensor's checksum, and the checksum of its bytes as stored there.
std::string ChecksumKey(std::string_view tensor_name);
std::string TensorChecksum(std::span<const std::byte> data);

// The header the reference writer produces for these tensors: entries ordered by dtype (widest
// first) then name, "__metadata__" first, padded with spaces to a multiple of 8 bytes. Sets each
// tensor's data offset in `offsets` (same order as `tensors`).
std::string BuildSafetensorsHeader(const std::vector<TensorSpec>& tensors,
                                   const SafetensorsMetadata& metadata,
                                   std::vector<uint64_t>* offsets);

class SafetensorsWriter {
 public:
  // Creates a temporary file beside `path` and writes the header. Names must be unique. With
  // `checksums`, every tensor's checksum is stored after `metadata`'s entries.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      std::string path, std::vector<TensorSpec> tensors,
      SafetensorsMetadata metadata = {{"format", "pt"}}, bool checksums = false);
  // Destroying an unfinished writer removes its temporary file.
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes one tensor's bytes; the size must match its spec. Each tensor exactly once.
  absl::Status Write(std::string_view name, std::span<const std::byte> data);
  // Writes the next bytes of a tensor: its pieces in order, front to back, until all its bytes
  // are there (pieces of several tensors may interleave). The checksum is the same as Write's.
  absl::Status Append(std::string_view name, std::span<const std::byte> data);
  // Checks every tensor was written, fsyncs and renames the file into place.
  absl::Status Finish();

  const std::string& path() const { return path_; }
  uint64_t data_size() const { return data_size_; }

 private:
  SafetensorsWriter() = default;
  std::string path_;
  fs::AtomicFileWriter file_;
  SafetensorsMetadata metadata_;
  bool checksums_ = false;
  size_t checksum_base_ = 0;  // metadata_ index of the first checksum
  uint64_t data_start_ = 0;
  uint64_t data_size_ = 0;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> offsets_;
  std::vector<bool> written_;
  std::vector<uint64_t> appended_;  // Bytes of each tensor written so far.
  // The checksum state of each tensor written in pieces, from its first piece to its last.
  struct FreeState {
    void operator()(XXH3_state_s* state) const;
  };
  absl::flat_hash_map<size_t, std::unique_ptr<XXH3_state_s, FreeState>> partial_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// Convenience for small files: writes all tensors at once.
struct NamedTensorData {
  TensorSpec spec;
  std::span<const std::byte> data;
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensorData>& tensors,
                              SafetensorsMetadata metadata = {{"format", "pt"}});

}  // namespace leantron::ckpt
