#include "trainer/core/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace leantron::trainer {
namespace {

constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table = {};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

uint32_t MaskedCrc(const void* data, size_t n) {
  const uint32_t crc = Crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void Varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void LengthDelimited(std::string* out, int field, const std::string& bytes) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  Varint(out, bytes.size());
  out->append(bytes);
}
template <typename T>
void Fixed(std::string* out, int field, int wire_type, T value) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));  // little-endian host, as protobuf's fixed encodings
  out->append(b, sizeof(T));
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("--tensorboard-dir ", dir, ": ", ec.message()));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter());
  w->path_ =
      absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(WallTime()), ".", host);
  w->file_ = std::fopen(w->path_.c_str(), "wb");
  if (w->file_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", w->path_));
  std::string event;
  Fixed<double>(&event, 1, 1, WallTime());      // wall_time
  LengthDelimited(&event, 3, "brain.Event:2");  // file_version
  w->WriteRecord(event);
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::AddScalar(const std::string& tag, double value, int64_t step) {
  std::string v, summary, event;
  LengthDelimited(&v, 1, tag);                        // Summary.Value.tag
  Fixed<float>(&v, 2, 5, static_cast<float>(value));  // Summary.Value.simple_value
  LengthDelimited(&summary, 1, v);                    // Summary.value
  Fixed<double>(&event, 1, 1, WallTime());            // Event.wall_time
  Varint(&event, (2 << 3) | 0);                       // Event.step
  Varint(&event, static_cast<uint64_t>(step));
  LengthDelimited(&event, 5, summary);  // Event.summary
  WriteRecord(event);
}

void TensorBoardWriter::WriteRecord(const std::string& event) {
  const uint64_t len = event.size();
  const uint32_t len_crc = MaskedCrc(&len, sizeof(len));
  const uint32_t data_crc = MaskedCrc(event.data(), event.size());
  std::fwrite(&len, sizeof(len), 1, file_);
  std::fwrite(&len_crc, sizeof(len_crc), 1, file_);
  std::fwrite(event.data(), 1, event.size(), file_);
  std::fwrite(&data_crc, sizeof(data_crc), 1, file_);
  std::fflush(file_);
}

}  // namespace leantron::trainer
