// File primitives for the dataset code: a read-only memory map, and a buffered output file that
// appears under its final name only when committed (temporary name, fsync, rename), so an
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

// Sequential writer to `<final>.tmp-<pid>-<n>`; Commit() flushes, fsyncs and renames it to the
// final name. Destroying an uncommitted writer removes the temporary file.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& final_path);
  AtomicFileWriter() = default;
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Write(const void* data, size_t size);
  absl::Status Write(std::string_view bytes) { return Write(bytes.data(), bytes.size()); }
  // Flushes and fsyncs without renaming: the data is durable under the temporary name.
  absl::Status Flush(bool sync);
  // Flush, fsync, rename to the final path. The writer is closed afterwards.
  absl::Status Commit();
  // Closes and removes the temporary file (idempotent).
  void Abandon();

  uint64_t bytes_written() const { return bytes_written_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

 private:
  absl::Status FlushBuffer();
  int fd_ = -1;
  int cleanup_slot_ = -1;  // registration for InstallTempFileCleanupOnSignals
  std::string final_path_;
  std::string temp_path_;
  std::vector<uint8_t> buffer_;
  uint64_t bytes_written_ = 0;
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

// Makes SIGINT, SIGTERM and SIGHUP remove the temporary files of every AtomicFileWriter still
// open before the process dies (with the signal's default action, so the exit status still
// tells). For tools: a killed run then leaves nothing behind; SIGKILL leaves only `*.tmp-*`.
void InstallTempFileCleanupOnSignals();

// "<path>: <strerror(errno)>" as an absl::Status of the matching kind.
absl::Status ErrnoError(absl::string_view what, const std::string& path, int err);

}  // namespace leantron::data
