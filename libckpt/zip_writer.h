// Writing zip archives the way torch.save does (PyTorch's PyTorchStreamWriter over miniz), so
// torch.load, Python's zipfile and our own reader all read them: every record stored uncompressed
// under the archive folder ("<name>/data.pkl", "<name>/data/0", ...), its data 64-byte aligned by
// an "FB" padding extra field, a data descriptor with the CRC-32 and sizes after it, zip64 fields
// where sizes or offsets pass 4 GiB, and zip64 end records.
//
// A record's space is reserved first (its size known) and its bytes may then arrive in any order
// and in pieces (a distributed optimizer's flat buffer is filled parameter by parameter); each
// piece's CRC is combined at Finish, and unwritten gaps are zeros. The file goes through
// libfs::AtomicFileWriter: a temporary name until Commit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "libfs/atomic_file.h"

namespace leantron::ckpt {

class TorchZipWriter {
 public:
  // `archive_name` is the folder of every record (torch uses the file's stem).
  static absl::StatusOr<std::unique_ptr<TorchZipWriter>> Create(const std::string& path,
                                                                std::string archive_name);
  // Reserves `size` bytes for a record named `name` inside the archive folder; returns its index.
  absl::StatusOr<size_t> Reserve(std::string_view name, uint64_t size);
  // Writes bytes of record `record` at `offset` within it.
  absl::Status Write(size_t record, uint64_t offset, std::span<const std::byte> bytes);
  // Reserve + Write of a whole record.
  absl::Status Add(std::string_view name, std::span<const std::byte> bytes);
  absl::Status Add(std::string_view name, std::string_view text) {
    return Add(name, std::as_bytes(std::span<const char>(text.data(), text.size())));
  }
  // Data descriptors, central directory and end records; fsync. Then Commit renames into place.
  absl::Status Finish();
  absl::Status Commit();
  const std::string& path() const { return file_.final_path(); }
  uint64_t bytes_written() const { return end_; }

 private:
  struct Piece {
    uint64_t offset = 0, size = 0;
    uint32_t crc = 0;
  };
  struct Record {
    std::string name;
    uint64_t header = 0;  // Offset of the local header.
    uint64_t data = 0;    // Offset of the data.
    uint64_t size = 0;
    bool zip64_sizes = false;  // The local header carries zip64 sizes (so does the descriptor).
    std::vector<Piece> pieces;
  };
  TorchZipWriter() = default;
  absl::Status WriteAt(uint64_t offset, std::span<const std::byte> bytes);
  absl::StatusOr<uint32_t> RecordCrc(Record& record) const;

  fs::AtomicFileWriter file_;
  std::string prefix_;
  uint64_t end_ = 0;
  uint16_t dos_time_ = 0, dos_date_ = 0;
  std::vector<Record> records_;
  bool finished_ = false;
};

}  // namespace leantron::ckpt
