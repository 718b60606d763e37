#include "libckpt/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "absl/strings/str_join.h"
#include "libckpt/json_quote.h"
#include "libckpt/strings.h"
#include "libfs/atomic_file.h"

namespace leantron::ckpt {
namespace {

absl::Status PwriteAll(int fd, const std::byte* data, size_t size, uint64_t offset,
                       const std::string& path) {
  while (size > 0) {
    ssize_t n = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(Cat(path, ": write failed: ", std::strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t TensorSpec::num_bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (uint64_t dim : shape) n *= dim;
  return n;
}

std::string BuildSafetensorsHeader(const std::vector<TensorSpec>& tensors,
                                   const SafetensorsMetadata& metadata,
                                   std::vector<uint64_t>* offsets) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  // The reference writer sorts by dtype descending (its enum is ordered by alignment), then name.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  offsets->assign(tensors.size(), 0);
  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i) {
      if (i > 0) json += ",";
      CatAppend(&json, JsonQuote(metadata[i].first), ":", JsonQuote(metadata[i].second));
    }
    json += "}";
    first = false;
  }
  uint64_t cursor = 0;
  for (size_t index : order) {
    const TensorSpec& spec = tensors[index];
    (*offsets)[index] = cursor;
    uint64_t end = cursor + spec.num_bytes();
    CatAppend(&json, first ? "" : ",", JsonQuote(spec.name), ":{\"dtype\":\"",
              DTypeName(spec.dtype), "\",\"shape\":[", absl::StrJoin(spec.shape, ","),
              "],\"data_offsets\":[", cursor, ",", end, "]}");
    first = false;
    cursor = end;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');
  return json;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    std::string path, std::vector<TensorSpec> tensors, SafetensorsMetadata metadata) {
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  writer->path_ = std::move(path);
  writer->temp_path_ = writer->path_ + ".tmp";
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (DTypeSize(tensors[i].dtype) == 0) {
      return absl::InvalidArgumentError(Cat(writer->path_, ": tensor '", tensors[i].name,
                                            "': sub-byte dtypes cannot be written"));
    }
    if (tensors[i].name == "__metadata__" || !writer->index_.emplace(tensors[i].name, i).second) {
      return absl::InvalidArgumentError(
          Cat(writer->path_, ": tensor name '", tensors[i].name, "' is reserved or duplicate"));
    }
  }
  std::string header = BuildSafetensorsHeader(tensors, metadata, &writer->offsets_);
  for (const TensorSpec& spec : tensors) writer->data_size_ += spec.num_bytes();
  writer->tensors_ = std::move(tensors);
  writer->written_.assign(writer->tensors_.size(), false);
  writer->fd_ = ::open(writer->temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (writer->fd_ < 0) {
    return absl::InternalError(Cat(writer->temp_path_, ": cannot create: ", std::strerror(errno)));
  }
  std::byte length[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  writer->data_start_ = 8 + n;
  if (auto s = PwriteAll(writer->fd_, length, 8, 0, writer->temp_path_); !s.ok()) return s;
  if (auto s = PwriteAll(writer->fd_, reinterpret_cast<const std::byte*>(header.data()), n, 8,
                         writer->temp_path_);
      !s.ok()) {
    return s;
  }
  // Size the file now so zero-byte tensors and out-of-order writes leave no gap to fill.
  if (::ftruncate(writer->fd_, static_cast<off_t>(writer->data_start_ + writer->data_size_)) != 0) {
    return absl::InternalError(
        Cat(writer->temp_path_, ": cannot size file: ", std::strerror(errno)));
  }
  return writer;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(temp_path_.c_str());
}

absl::Status SafetensorsWriter::Write(std::string_view name, std::span<const std::byte> data) {
  auto it = index_.find(ToAbsl(name));
  if (it == index_.end()) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' was not declared"));
  }
  size_t i = it->second;
  if (written_[i]) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' written twice"));
  }
  if (data.size() != tensors_[i].num_bytes()) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' has ", data.size(),
                                          " bytes, expected ", tensors_[i].num_bytes()));
  }
  if (auto s = PwriteAll(fd_, data.data(), data.size(), data_start_ + offsets_[i], temp_path_);
      !s.ok()) {
    return s;
  }
  written_[i] = true;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!written_[i]) {
      return absl::FailedPreconditionError(
          Cat(path_, ": tensor '", tensors_[i].name, "' was never written"));
    }
  }
  if (::fsync(fd_) != 0) {
    return absl::InternalError(Cat(temp_path_, ": fsync failed: ", std::strerror(errno)));
  }
  ::close(fd_);
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(Cat(path_, ": rename failed: ", std::strerror(errno)));
  }
  finished_ = true;
  return fs::FsyncParentDir(path_);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensorData>& tensors,
                              SafetensorsMetadata metadata) {
  std::vector<TensorSpec> specs;
  for (const NamedTensorData& t : tensors) specs.push_back(t.spec);
  auto writer = SafetensorsWriter::Create(path, std::move(specs), std::move(metadata));
  if (!writer.ok()) return writer.status();
  for (const NamedTensorData& t : tensors) {
    if (auto s = (*writer)->Write(t.spec.name, t.data); !s.ok()) return s;
  }
  return (*writer)->Finish();
}

}  // namespace leantron::ckpt
