#include "libckpt/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libckpt/json_quote.h"
#include "libckpt/strings.h"
#include "xxhash.h"

namespace leantron::ckpt {

void SafetensorsWriter::FreeState::operator()(XXH3_state_s* state) const { XXH3_freeState(state); }

std::string ChecksumKey(std::string_view tensor_name) { return Cat("xxh3_64:", tensor_name); }

std::string TensorChecksum(std::span<const std::byte> data) {
  return absl::StrFormat("%016x", XXH3_64bits(data.data(), data.size()));
}

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
    std::string path, std::vector<TensorSpec> tensors, SafetensorsMetadata metadata,
    bool checksums) {
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  writer->path_ = std::move(path);
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
  writer->checksums_ = checksums;
  if (checksums) {
    writer->checksum_base_ = metadata.size();
    // Placeholders of the final length: Finish() rewrites the header in place.
    for (const TensorSpec& spec : tensors) {
      metadata.emplace_back(ChecksumKey(spec.name), std::string(16, '0'));
    }
  }
  writer->metadata_ = std::move(metadata);
  std::string header = BuildSafetensorsHeader(tensors, writer->metadata_, &writer->offsets_);
  for (const TensorSpec& spec : tensors) writer->data_size_ += spec.num_bytes();
  writer->tensors_ = std::move(tensors);
  writer->written_.assign(writer->tensors_.size(), false);
  writer->appended_.assign(writer->tensors_.size(), 0);
  auto file = fs::AtomicFileWriter::Create(writer->path_);
  if (!file.ok()) return file.status();
  writer->file_ = *std::move(file);
  std::byte length[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  writer->data_start_ = 8 + n;
  if (auto s = writer->file_.WriteAt(0, length, 8); !s.ok()) return s;
  if (auto s = writer->file_.WriteAt(8, header.data(), n); !s.ok()) return s;
  // Size the file now so zero-byte tensors and out-of-order writes leave no gap to fill.
  if (auto s = writer->file_.Truncate(writer->data_start_ + writer->data_size_); !s.ok()) return s;
  return writer;
}

absl::Status SafetensorsWriter::Write(std::string_view name, std::span<const std::byte> data) {
  auto it = index_.find(ToAbsl(name));
  if (it == index_.end()) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' was not declared"));
  }
  const size_t i = it->second;
  if (written_[i] || appended_[i] > 0) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' written twice"));
  }
  if (data.size() != tensors_[i].num_bytes()) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' has ", data.size(),
                                          " bytes, expected ", tensors_[i].num_bytes()));
  }
  return Append(name, data);
}

absl::Status SafetensorsWriter::Append(std::string_view name, std::span<const std::byte> data) {
  auto it = index_.find(ToAbsl(name));
  if (it == index_.end()) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' was not declared"));
  }
  const size_t i = it->second;
  if (written_[i]) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' written twice"));
  }
  const uint64_t size = tensors_[i].num_bytes();
  const uint64_t at = appended_[i];
  if (data.size() > size - at) {
    return absl::InvalidArgumentError(Cat(path_, ": tensor '", name, "' gets ", at + data.size(),
                                          " bytes or more, expected ", size));
  }
  if (auto s = file_.WriteAt(data_start_ + offsets_[i] + at, data.data(), data.size()); !s.ok()) {
    return s;
  }
  appended_[i] = at + data.size();
  const bool whole = at == 0 && data.size() == size;
  if (checksums_ && whole) {
    metadata_[checksum_base_ + i].second = TensorChecksum(data);
  } else if (checksums_) {
    auto state = partial_.find(i);
    if (state == partial_.end()) {
      state = partial_.emplace(i, XXH3_createState()).first;
      if (state->second == nullptr) return absl::ResourceExhaustedError("out of memory");
      XXH3_64bits_reset(state->second.get());
    }
    XXH3_64bits_update(state->second.get(), data.data(), data.size());
    if (appended_[i] == size) {
      metadata_[checksum_base_ + i].second =
          absl::StrFormat("%016x", XXH3_64bits_digest(state->second.get()));
      partial_.erase(state);
    }
  }
  written_[i] = appended_[i] == size;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!written_[i] && appended_[i] > 0) {
      return absl::FailedPreconditionError(Cat(path_, ": tensor '", tensors_[i].name, "' got only ",
                                               appended_[i], " of its ", tensors_[i].num_bytes(),
                                               " bytes"));
    }
    if (!written_[i]) {
      return absl::FailedPreconditionError(
          Cat(path_, ": tensor '", tensors_[i].name, "' was never written"));
    }
  }
  if (checksums_) {
    std::vector<uint64_t> offsets;
    const std::string header = BuildSafetensorsHeader(tensors_, metadata_, &offsets);
    if (8 + header.size() != data_start_) {
      return absl::InternalError(Cat(path_, ": header changed length"));
    }
    if (auto s = file_.WriteAt(8, header.data(), header.size()); !s.ok()) return s;
  }
  return file_.Commit();
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
