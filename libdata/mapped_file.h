// File primitives for the dataset code: a read-only memory map and an anonymous spool file.
// Output files are written with libfs's AtomicFileWriter (temporary name, fsync, rename), so an
// interrupted writer never leaves a file that looks complete.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "libfs/atomic_file.h"

namespace leantron::data {

// A read-only mmap of a whole file. An empty file maps to an empty span (mmap rejects length 0).
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A scratch file, unlinked as soon as it is created, for spooling arrays too large for memory.
// Written sequentially, then read back sequentially in fixed-size chunks.
class SpoolFile {
 public:
  static absl::StatusOr<SpoolFile> Create(const std::string& directory);
  SpoolFile() = default;
  SpoolFile(SpoolFile&& other) noexcept;
  SpoolFile& operator=(SpoolFile&& other) noexcept;
  SpoolFile(const SpoolFile&) = delete;
  SpoolFile& operator=(const SpoolFile&) = delete;
  ~SpoolFile();

  absl::Status Append(const void* data, size_t size);
  uint64_t size() const { return size_; }
  // Calls `sink(chunk, chunk_size)` over the whole contents, in order, in bounded chunks.
  template <typename Sink>
  absl::Status ForEachChunk(Sink&& sink);

 private:
  absl::Status FlushBuffer();
  absl::Status ReadAt(uint64_t offset, void* data, size_t size);
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
  uint64_t size_ = 0;
};

template <typename Sink>
absl::Status SpoolFile::ForEachChunk(Sink&& sink) {
  if (absl::Status s = FlushBuffer(); !s.ok()) return s;
  std::vector<uint8_t> chunk(1 << 20);
  for (uint64_t offset = 0; offset < size_;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size_ - offset));
    if (absl::Status s = ReadAt(offset, chunk.data(), n); !s.ok()) return s;
    if (absl::Status s = sink(chunk.data(), n); !s.ok()) return s;
    offset += n;
  }
  return absl::OkStatus();
}

// "<what> <path>: <strerror(err)>" as an absl::Status of the matching kind.
using fs::ErrnoError;

}  // namespace leantron::data
