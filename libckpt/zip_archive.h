// Reading zip archives the way torch.save writes them (PyTorch's miniz writer): every entry stored
// uncompressed, data aligned by padding in the local header's extra field, zip64 records, sizes in
// the central directory (the local header may hold zeros and a data descriptor follow the data).
// An archive may be a whole file or a slice of one (torch.distributed.checkpoint writes one
// torch.save archive per tensor chunk into a .distcp file).
//
// Nothing is trusted: every count, size and offset is checked against the bytes before it is used,
// names must be unique, and compression, encryption and multi-disk archives are refused with an
// error naming the archive and the entry.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace leantron::ckpt {

struct ZipEntry {
  std::string name;
  uint64_t offset = 0;  // Of the data, from the start of the archive.
  uint64_t size = 0;
  uint32_t crc32 = 0;  // As the central directory states it.
};

class ZipArchive {
 public:
  // `bytes` must outlive the archive; `source` names it in errors ("<file>" or "<file>@<offset>").
  // `checked`, when given, is called with each entry's local header once it is checked: they lie
  // all over the file, one beside each entry's data, so a caller parsing a mapping drops their
  // pages as it goes rather than keeping a page (and its fault-around window) per entry resident.
  static absl::StatusOr<ZipArchive> Parse(
      std::span<const std::byte> bytes, std::string source,
      const std::function<void(std::span<const std::byte>)>& checked = {});

  const std::string& source() const { return source_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* Find(std::string_view name) const;
  std::span<const std::byte> Data(const ZipEntry& entry) const {
    return bytes_.subspan(entry.offset, entry.size);
  }
  // Compares an entry's bytes with its CRC-32 (one read of them); DataLoss names the entry.
  // `done`, when given, is called with each 2 MiB piece once it is read (to drop its pages).
  absl::Status VerifyCrc(const ZipEntry& entry,
                         const std::function<void(std::span<const std::byte>)>& done = {}) const;

 private:
  std::span<const std::byte> bytes_;
  std::string source_;
  std::vector<ZipEntry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// CRC-32 (zip's, the same as zlib's crc32) of `bytes`, continuing from `crc`.
uint32_t Crc32(uint32_t crc, std::span<const std::byte> bytes);

}  // namespace leantron::ckpt
