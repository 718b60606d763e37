// safetensors reading: header parsing with every rule of the reference (Rust) reader, and an
// mmap-backed file whose tensors are zero-copy views.
//
// Format: u64 little-endian header length N | N bytes of UTF-8 JSON | data buffer. The JSON maps
// tensor names to {"dtype", "shape", "data_offsets": [begin, end)} relative to the buffer, plus an
// optional "__metadata__" string->string map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "libckpt/dtype.h"

namespace leantron::ckpt {

// The reference reader refuses headers larger than this.
inline constexpr uint64_t kMaxSafetensorsHeaderSize = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // Offsets into the data buffer, [begin, end).
  uint64_t end = 0;

  uint64_t num_elements() const;
  uint64_t num_bytes() const { return end - begin; }
};

struct SafetensorsHeader {
  // Sorted by data offset, which is also the order a conforming writer stores them.
  std::vector<TensorInfo> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;
  uint64_t data_start = 0;  // 8 + N.
};

// Parses and validates the header of a safetensors file whose full contents are `file` (the header
// must lie within it; the data buffer is only measured, never read). `source` names the file in
// error messages. This is the function the fuzzer drives.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const std::byte> file,
                                                         std::string_view source);

struct TensorView {
  const TensorInfo* info = nullptr;
  std::span<const std::byte> data;
};

// A read-only, memory-mapped safetensors file. Views stay valid for the object's lifetime.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::vector<std::pair<std::string, std::string>>& metadata() const {
    return header_.metadata;
  }
  const TensorInfo* Find(std::string_view name) const;
  // NotFound names the file and the tensor.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  // Drops the pages behind a view (rounded out to 64 KiB, the kernel's fault-around window) from
  // this process's resident set once it has been consumed, so streaming through a large file
  // keeps memory bounded by the tensors in flight. Never loses data: the mapping is read-only,
  // and a page dropped under another live view is faulted in again when that view is read.
  void Release(const TensorView& view) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const std::byte* map_ = nullptr;
  size_t map_size_ = 0;
  SafetensorsHeader header_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace leantron::ckpt
