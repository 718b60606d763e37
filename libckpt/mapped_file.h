// A read-only memory mapping of a whole file, shared by the readers of PyTorch archives: tensors
// are views into it, and pages a reader has consumed are dropped from the resident set (Release,
// ReleaseBehind) so that streaming through a large checkpoint keeps memory bounded by what is in
// flight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace leantron::ckpt {

class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {map_, size_}; }
  // Drops the pages behind `view` (a span of this mapping), rounded out to what a fault may have
  // mapped beside them: the kernel's 64 KiB fault-around window and the 2 MiB (file-aligned) large
  // folios the page cache may hold. Never loses data: the mapping is private and read-only, and a
  // page dropped under another live view is faulted in again when read.
  void Release(std::span<const std::byte> view) const;
  // For a reader going front to back through `view` while later bytes are still being read (by
  // it or by a thread reading ahead): what Release drops, but only up to the last 2 MiB boundary
  // (in the file) before view's end, so that no page the reader is about to use is dropped.
  void ReleaseBehind(std::span<const std::byte> view) const;

 private:
  MappedFile() = default;
  // Drops the pages from `from` (rounded down as Release rounds) to address `upto`.
  void Drop(const std::byte* from, uintptr_t upto) const;
  std::string path_;
  const std::byte* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace leantron::ckpt
