#include "libckpt/zip_writer.h"

#include <zlib.h>

#include <algorithm>
#include <ctime>

#include "libckpt/strings.h"
#include "libckpt/zip_archive.h"

namespace leantron::ckpt {
namespace {

constexpr uint64_t kAlignment = 64;  // torch's kFieldAlignment
constexpr uint64_t k32 = 0xFFFFFFFF;

class Bytes {
 public:
  void U16(uint64_t v) {
    for (int i = 0; i < 2; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
  void U32(uint64_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
  void Text(std::string_view s) {
    for (char c : s) out_.push_back(static_cast<std::byte>(c));
  }
  void Fill(size_t n, char c) { out_.insert(out_.end(), n, static_cast<std::byte>(c)); }
  std::span<const std::byte> span() const { return out_; }
  size_t size() const { return out_.size(); }

 private:
  std::vector<std::byte> out_;
};

// zip64 extended information: sizes when they pass 32 bits, the local header offset when it does.
void Zip64Extra(Bytes* b, bool sizes, uint64_t size, bool offset, uint64_t header) {
  if (!sizes && !offset) return;
  b->U16(0x0001);
  b->U16((sizes ? 16 : 0) + (offset ? 8 : 0));
  if (sizes) {
    b->U64(size);
    b->U64(size);
  }
  if (offset) b->U64(header);
}

uint32_t ZeroCrc(uint32_t crc, uint64_t n) {
  static const std::vector<std::byte> zeros(1 << 16);
  while (n > 0) {
    const uint64_t step = std::min<uint64_t>(n, zeros.size());
    crc = Crc32(crc, std::span<const std::byte>(zeros.data(), step));
    n -= step;
  }
  return crc;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TorchZipWriter>> TorchZipWriter::Create(const std::string& path,
                                                                       std::string archive_name) {
  auto file = fs::AtomicFileWriter::Create(path);
  if (!file.ok()) return file.status();
  std::unique_ptr<TorchZipWriter> writer(new TorchZipWriter());
  writer->file_ = *std::move(file);
  writer->prefix_ = std::move(archive_name) + "/";
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  localtime_r(&now, &t);
  writer->dos_time_ = static_cast<uint16_t>((t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec / 2));
  writer->dos_date_ =
      static_cast<uint16_t>(((t.tm_year + 1900 - 1980) << 9) | ((t.tm_mon + 1) << 5) | t.tm_mday);
  return writer;
}

absl::Status TorchZipWriter::WriteAt(uint64_t offset, std::span<const std::byte> bytes) {
  if (bytes.empty()) return absl::OkStatus();
  return file_.WriteAt(offset, bytes.data(), bytes.size());
}

absl::StatusOr<size_t> TorchZipWriter::Reserve(std::string_view name, uint64_t size) {
  if (finished_) return absl::FailedPreconditionError(Cat(path(), ": archive already finished"));
  Record r;
  r.name = Cat(prefix_, name);
  r.header = end_;
  r.size = size;
  r.zip64_sizes = size >= k32;
  const bool zip64_offset = r.header >= k32;
  Bytes zip64;
  Zip64Extra(&zip64, r.zip64_sizes, size, zip64_offset, r.header);
  // Pad so that the data starts at a multiple of 64 (PyTorchStreamWriter's getPadding).
  const uint64_t start = r.header + 30 + r.name.size() + zip64.size() + 4;
  const uint64_t pad = (kAlignment - start % kAlignment) % kAlignment;
  Bytes h;
  h.U32(0x04034b50);
  h.U16(0);                           // version needed (stored)
  h.U16(size > 0 ? 0x0808 : 0x0800);  // UTF-8 names; sizes in a data descriptor
  h.U16(0);                           // stored
  h.U16(dos_time_);
  h.U16(dos_date_);
  h.U32(0);  // CRC-32, sizes: in the data descriptor and the central directory
  h.U32(0);
  h.U32(0);
  h.U16(r.name.size());
  h.U16(zip64.size() + 4 + pad);
  h.Text(r.name);
  for (std::byte b : zip64.span()) h.Fill(1, static_cast<char>(b));
  h.Text("FB");
  h.U16(pad);
  h.Fill(pad, 'Z');
  if (auto s = WriteAt(r.header, h.span()); !s.ok()) return s;
  r.data = r.header + h.size();
  end_ = r.data + size + (size > 0 ? (r.zip64_sizes ? 24 : 16) : 0);
  records_.push_back(std::move(r));
  return records_.size() - 1;
}

absl::Status TorchZipWriter::Write(size_t record, uint64_t offset,
                                   std::span<const std::byte> bytes) {
  Record& r = records_.at(record);
  if (offset > r.size || bytes.size() > r.size - offset) {
    return absl::InternalError(Cat(path(), ": ", bytes.size(), " bytes at ", offset,
                                   " overrun record '", r.name, "' of ", r.size));
  }
  if (auto s = WriteAt(r.data + offset, bytes); !s.ok()) return s;
  r.pieces.push_back({offset, bytes.size(), Crc32(0, bytes)});
  return absl::OkStatus();
}

absl::Status TorchZipWriter::Add(std::string_view name, std::span<const std::byte> bytes) {
  auto record = Reserve(name, bytes.size());
  if (!record.ok()) return record.status();
  return Write(*record, 0, bytes);
}

absl::StatusOr<uint32_t> TorchZipWriter::RecordCrc(Record& r) const {
  std::sort(r.pieces.begin(), r.pieces.end(),
            [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  uint32_t crc = 0;
  uint64_t at = 0;
  for (const Piece& p : r.pieces) {
    if (p.offset < at) {
      return absl::InternalError(
          Cat(path(), ": record '", r.name, "' written twice at ", p.offset));
    }
    crc = ZeroCrc(crc, p.offset - at);
    crc = static_cast<uint32_t>(::crc32_combine(crc, p.crc, static_cast<z_off_t>(p.size)));
    at = p.offset + p.size;
  }
  return ZeroCrc(crc, r.size - at);
}

absl::Status TorchZipWriter::Finish() {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  Bytes central;
  for (Record& r : records_) {
    auto crc = RecordCrc(r);
    if (!crc.ok()) return crc.status();
    if (r.size > 0) {
      Bytes d;
      d.U32(0x08074b50);
      d.U32(*crc);
      if (r.zip64_sizes) {
        d.U64(r.size);
        d.U64(r.size);
      } else {
        d.U32(r.size);
        d.U32(r.size);
      }
      if (auto s = WriteAt(r.data + r.size, d.span()); !s.ok()) return s;
    }
    Bytes zip64;
    Zip64Extra(&zip64, r.size >= k32, r.size, r.header >= k32, r.header);
    central.U32(0x02014b50);
    central.U16(0);  // made by
    central.U16(0);  // needed
    central.U16(r.size > 0 ? 0x0808 : 0x0800);
    central.U16(0);
    central.U16(dos_time_);
    central.U16(dos_date_);
    central.U32(*crc);
    central.U32(std::min(r.size, k32));
    central.U32(std::min(r.size, k32));
    central.U16(r.name.size());
    central.U16(zip64.size());
    central.U16(0);  // comment
    central.U16(0);  // disk
    central.U16(0);  // internal attributes
    central.U32(0);  // external attributes
    central.U32(std::min(r.header, k32));
    central.Text(r.name);
    for (std::byte b : zip64.span()) central.Fill(1, static_cast<char>(b));
  }
  const uint64_t cd_offset = end_;
  const uint64_t n = records_.size();
  Bytes tail;
  const uint64_t z64 = cd_offset + central.size();
  tail.U32(0x06064b50);  // zip64 end of central directory
  tail.U64(44);
  tail.U16(0x031E);
  tail.U16(0x002D);
  tail.U32(0);
  tail.U32(0);
  tail.U64(n);
  tail.U64(n);
  tail.U64(central.size());
  tail.U64(cd_offset);
  tail.U32(0x07064b50);  // zip64 locator
  tail.U32(0);
  tail.U64(z64);
  tail.U32(1);
  tail.U32(0x06054b50);  // end of central directory
  tail.U16(0);
  tail.U16(0);
  tail.U16(std::min<uint64_t>(n, 0xFFFF));
  tail.U16(std::min<uint64_t>(n, 0xFFFF));
  tail.U32(std::min<uint64_t>(central.size(), k32));
  tail.U32(std::min(cd_offset, k32));
  tail.U16(0);
  if (auto s = WriteAt(cd_offset, central.span()); !s.ok()) return s;
  if (auto s = WriteAt(z64, tail.span()); !s.ok()) return s;
  end_ = z64 + tail.size();
  return file_.Finish();
}

absl::Status TorchZipWriter::Commit() {
  if (auto s = Finish(); !s.ok()) return s;
  return file_.Commit();
}

}  // namespace leantron::ckpt
