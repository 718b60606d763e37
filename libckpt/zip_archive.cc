#include "libckpt/zip_archive.h"

#include <libdeflate.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kZip64LocatorSize = 20;
constexpr uint64_t kZip64EndMinSize = 56;
constexpr uint64_t kCentralHeaderSize = 46;
constexpr uint64_t kLocalHeaderSize = 30;

uint16_t U16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint16_t>(p[0]) | static_cast<uint16_t>(p[1]) << 8);
}
uint32_t U32(const std::byte* p) {
  return static_cast<uint32_t>(U16(p)) | static_cast<uint32_t>(U16(p + 2)) << 16;
}
uint64_t U64(const std::byte* p) {
  return static_cast<uint64_t>(U32(p)) | static_cast<uint64_t>(U32(p + 4)) << 32;
}

absl::Status Corrupt(const std::string& source, std::string_view why) {
  return absl::DataLossError(Cat(source, ": not a valid PyTorch zip archive: ", why));
}

// Where the end-of-central-directory record starts: the last signature whose comment runs exactly
// to the end of the archive.
std::optional<uint64_t> FindEnd(std::span<const std::byte> bytes) {
  const uint64_t size = bytes.size();
  const uint64_t lowest = size - kEndSize > 0xFFFF ? size - kEndSize - 0xFFFF : 0;
  for (uint64_t pos = size - kEndSize + 1; pos-- > lowest;) {
    const std::byte* p = bytes.data() + pos;
    if (U32(p) == kEndSig && kEndSize + U16(p + 20) == size - pos) return pos;
  }
  return std::nullopt;
}

}  // namespace

uint32_t Crc32(uint32_t crc, std::span<const std::byte> bytes) {
  // libdeflate's carry-less-multiply CRC: 14 GB/s against zlib 1.2's 4 on the AMD EPYC build
  // machine, where checking every record of a checkpoint took a fifth of an import's CPU time.
  return ::libdeflate_crc32(crc, bytes.data(), bytes.size());
}

absl::StatusOr<ZipArchive> ZipArchive::Parse(
    std::span<const std::byte> bytes, std::string source,
    const std::function<void(std::span<const std::byte>)>& checked) {
  const uint64_t size = bytes.size();
  if (size < kEndSize) return Corrupt(source, Cat("only ", size, " bytes"));
  const std::optional<uint64_t> end = FindEnd(bytes);
  if (!end) return Corrupt(source, "no end-of-central-directory record (truncated?)");
  const std::byte* e = bytes.data() + *end;
  if (U16(e + 4) != 0 || U16(e + 6) != 0) return Corrupt(source, "spans several disks");
  uint64_t count = U16(e + 10);
  uint64_t cd_size = U32(e + 12);
  uint64_t cd_offset = U32(e + 16);
  // Everything the central directory describes lies before `limit`.
  uint64_t limit = *end;
  if (*end >= kZip64LocatorSize && U32(e - kZip64LocatorSize) == kZip64LocatorSig) {
    const std::byte* locator = e - kZip64LocatorSize;
    const uint64_t z64 = U64(locator + 8);
    if (U32(locator + 4) != 0 || U32(locator + 16) > 1) {
      return Corrupt(source, "zip64 locator names another disk");
    }
    if (z64 > *end - kZip64LocatorSize || *end - kZip64LocatorSize - z64 < kZip64EndMinSize) {
      return Corrupt(source, "zip64 end record lies outside the archive");
    }
    const std::byte* r = bytes.data() + z64;
    if (U32(r) != kZip64EndSig) return Corrupt(source, "zip64 end record has a bad signature");
    if (U32(r + 16) != 0 || U32(r + 20) != 0) return Corrupt(source, "spans several disks");
    count = U64(r + 32);
    cd_size = U64(r + 40);
    cd_offset = U64(r + 48);
    limit = z64;
  } else if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    return Corrupt(source, "zip64 values without a zip64 end record");
  }
  if (cd_offset > limit || cd_size > limit - cd_offset) {
    return Corrupt(source, Cat("central directory [", cd_offset, ", +", cd_size,
                               ") lies outside the archive"));
  }
  if (count > cd_size / kCentralHeaderSize) {
    return Corrupt(source,
                   Cat(count, " entries cannot fit a ", cd_size, "-byte central directory"));
  }
  ZipArchive archive;
  archive.bytes_ = bytes;
  archive.source_ = std::move(source);
  const std::string& src = archive.source_;
  archive.entries_.reserve(count);
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd_end - at < kCentralHeaderSize) return Corrupt(src, "central directory is truncated");
    const std::byte* c = bytes.data() + at;
    if (U32(c) != kCentralHeaderSig) {
      return Corrupt(src, Cat("central directory entry ", i, " has a bad signature"));
    }
    const uint16_t flags = U16(c + 8);
    const uint16_t method = U16(c + 10);
    ZipEntry entry;
    entry.crc32 = U32(c + 16);
    uint64_t compressed = U32(c + 20);
    uint64_t uncompressed = U32(c + 24);
    const uint64_t name_len = U16(c + 28), extra_len = U16(c + 30), comment_len = U16(c + 32);
    uint64_t disk = U16(c + 34);
    uint64_t local = U32(c + 42);
    const uint64_t record = kCentralHeaderSize + name_len + extra_len + comment_len;
    if (record > cd_end - at)
      return Corrupt(src, Cat("central directory entry ", i, " overruns it"));
    entry.name.assign(reinterpret_cast<const char*>(c + kCentralHeaderSize), name_len);
    if (entry.name.empty()) return Corrupt(src, Cat("entry ", i, " has no name"));
    // Zip64 extended information: the fields whose 32-bit value is saturated, in this order.
    const std::byte* x = c + kCentralHeaderSize + name_len;
    for (uint64_t left = extra_len; left >= 4;) {
      const uint16_t id = U16(x), len = U16(x + 2);
      if (len > left - 4) return Corrupt(src, Cat("'", entry.name, "': extra field overruns"));
      if (id == 0x0001) {
        const std::byte* f = x + 4;
        uint64_t have = len;
        auto take = [&](uint64_t* value, uint64_t saturated, uint64_t width) -> bool {
          if (*value != saturated) return true;
          if (have < width) return false;
          *value = width == 8 ? U64(f) : U32(f);
          f += width;
          have -= width;
          return true;
        };
        if (!take(&uncompressed, 0xFFFFFFFF, 8) || !take(&compressed, 0xFFFFFFFF, 8) ||
            !take(&local, 0xFFFFFFFF, 8) || !take(&disk, 0xFFFF, 4)) {
          return Corrupt(src, Cat("'", entry.name, "': zip64 field is too short"));
        }
      }
      x += 4 + len;
      left -= 4 + len;
    }
    if (flags & 0x1) return Corrupt(src, Cat("'", entry.name, "' is encrypted"));
    if (method != 0) {
      return Corrupt(src, Cat("'", entry.name, "' is compressed (method ", method,
                              "); torch.save stores entries uncompressed"));
    }
    if (compressed != uncompressed) {
      return Corrupt(src, Cat("'", entry.name, "' is stored with differing sizes"));
    }
    if (disk != 0) return Corrupt(src, Cat("'", entry.name, "' lies on another disk"));
    if (local > cd_offset || cd_offset - local < kLocalHeaderSize) {
      return Corrupt(src, Cat("'", entry.name, "': local header lies outside the archive"));
    }
    const std::byte* l = bytes.data() + local;
    if (U32(l) != kLocalHeaderSig) {
      return Corrupt(src, Cat("'", entry.name, "': local header has a bad signature"));
    }
    const uint64_t data = local + kLocalHeaderSize + U16(l + 26) + U16(l + 28);
    if (data > cd_offset || uncompressed > cd_offset - data) {
      return Corrupt(src, Cat("'", entry.name, "': ", uncompressed, " bytes at offset ", data,
                              " run past the entries' end (", cd_offset, ")"));
    }
    if (U16(l + 26) != name_len ||
        std::memcmp(l + kLocalHeaderSize, entry.name.data(), name_len) != 0) {
      return Corrupt(src, Cat("'", entry.name, "': local header names another entry"));
    }
    if (checked) checked(bytes.subspan(local, data - local));
    entry.offset = data;
    entry.size = uncompressed;
    if (!archive.index_.emplace(entry.name, archive.entries_.size()).second) {
      return Corrupt(src, Cat("entry '", entry.name, "' appears twice"));
    }
    archive.entries_.push_back(std::move(entry));
    at += record;
  }
  return archive;
}

const ZipEntry* ZipArchive::Find(std::string_view name) const {
  auto it = index_.find(ToAbsl(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

absl::Status ZipArchive::VerifyCrc(
    const ZipEntry& entry, const std::function<void(std::span<const std::byte>)>& done) const {
  constexpr size_t kPiece = size_t{2} << 20;  // MappedFile::Release drops 2 MiB blocks.
  const std::span<const std::byte> data = Data(entry);
  uint32_t crc = 0;
  for (size_t at = 0; at < data.size(); at += kPiece) {
    const std::span<const std::byte> piece = data.subspan(at, std::min(kPiece, data.size() - at));
    crc = Crc32(crc, piece);
    if (done) done(piece);
  }
  if (crc != entry.crc32) {
    return absl::DataLossError(
        Cat(source_, ": entry '", entry.name, "' does not match its CRC-32 (corrupted)"));
  }
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
