#include "libckpt/hf_files.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_format.h"
#include "libckpt/json_quote.h"
#include "libckpt/strings.h"
#include "libfs/atomic_file.h"
#include "simdjson.h"

namespace leantron::ckpt {

namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<HfTensorFiles>> HfTensorFiles::Open(const std::string& dir) {
  auto files = std::make_unique<HfTensorFiles>();
  files->dir_ = dir;
  const fs::path index_path = fs::path(dir) / kHfIndexFile;
  std::vector<std::string> file_names;
  if (fs::exists(index_path)) {
    auto text = leantron::fs::ReadFileToString(index_path.string());
    if (!text.ok()) return text.status();
    simdjson::dom::parser parser;
    simdjson::dom::object weight_map;
    if (parser.parse(*text).get_object()["weight_map"].get(weight_map) != simdjson::SUCCESS) {
      return absl::InvalidArgumentError(Cat(index_path.string(), ": no \"weight_map\" object"));
    }
    std::map<std::string, std::vector<std::string>> names_by_file;
    for (auto entry : weight_map) {
      std::string_view file;
      if (entry.value.get_string().get(file) != simdjson::SUCCESS ||
          file.find('/') != std::string_view::npos) {
        return absl::InvalidArgumentError(
            Cat(index_path.string(), ": weight_map entry '", entry.key, "' is not a file name"));
      }
      names_by_file[std::string(file)].push_back(std::string(entry.key));
    }
    for (auto& [file_name, names] : names_by_file) {
      auto file = SafetensorsFile::Open((fs::path(dir) / file_name).string());
      if (!file.ok()) return file.status();
      for (const std::string& name : names) {
        if ((*file)->Find(name) == nullptr) {
          return absl::DataLossError(Cat(index_path.string(), ": '", name, "' is mapped to ",
                                         file_name, ", which does not hold it"));
        }
        files->file_of_[name] = files->files_.size();
      }
      files->files_.push_back(*std::move(file));
    }
  } else {
    auto file = SafetensorsFile::Open((fs::path(dir) / kHfSingleFile).string());
    if (!file.ok()) {
      return absl::NotFoundError(Cat(dir, ": neither ", kHfIndexFile, " nor a readable ",
                                     kHfSingleFile, " (", std::string(file.status().message()),
                                     ")"));
    }
    for (const TensorInfo& info : (*file)->tensors()) files->file_of_[info.name] = 0;
    files->files_.push_back(*std::move(file));
  }
  return files;
}

absl::StatusOr<TensorView> HfTensorFiles::Get(std::string_view name) const {
  auto it = file_of_.find(ToAbsl(name));
  if (it == file_of_.end()) return absl::NotFoundError(Cat(dir_, ": no tensor '", name, "'"));
  return files_[it->second]->Get(name);
}

bool HfTensorFiles::Contains(std::string_view name) const {
  return file_of_.contains(ToAbsl(name));
}

void HfTensorFiles::Release(std::string_view name, const TensorView& view) const {
  auto it = file_of_.find(ToAbsl(name));
  if (it != file_of_.end()) files_[it->second]->Release(view);
}

std::vector<std::string> HfTensorFiles::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : file_of_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::unique_ptr<HfShardedWriter>> HfShardedWriter::Create(
    const std::string& dir, std::vector<TensorSpec> tensors, uint64_t max_shard_bytes) {
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t current = 0;
  auto writer = std::make_unique<HfShardedWriter>();
  writer->dir_ = dir;
  for (TensorSpec& spec : tensors) {
    const uint64_t bytes = spec.num_bytes();
    if (current > 0 && current + bytes > max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    current += bytes;
    writer->total_size_ += bytes;
    writer->shard_of_[spec.name] = shards.size() - 1;
    shards.back().push_back(std::move(spec));
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(Cat(dir, ": cannot create: ", error.message()));
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = shards.size() == 1 ? std::string(kHfSingleFile)
                                          : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1,
                                                            shards.size());
    auto shard = SafetensorsWriter::Create((fs::path(dir) / name).string(), std::move(shards[i]));
    if (!shard.ok()) return shard.status();
    writer->shards_.push_back(*std::move(shard));
    writer->file_names_.push_back(std::move(name));
  }
  return writer;
}

absl::Status HfShardedWriter::Write(std::string_view name, std::span<const std::byte> data) {
  auto it = shard_of_.find(ToAbsl(name));
  if (it == shard_of_.end())
    return absl::InvalidArgumentError(Cat("'", name, "' was not declared"));
  return shards_[it->second]->Write(name, data);
}

absl::Status HfShardedWriter::Finish() {
  for (auto& shard : shards_) {
    if (auto s = shard->Finish(); !s.ok()) return s;
  }
  const fs::path index_path = fs::path(dir_) / kHfIndexFile;
  if (shards_.size() == 1) {
    std::error_code error;
    fs::remove(index_path, error);  // A stale index would shadow the single file.
    return absl::OkStatus();
  }
  std::map<std::string, size_t> sorted(shard_of_.begin(), shard_of_.end());
  std::string json =
      Cat("{\n  \"metadata\": {\n    \"total_size\": ", total_size_, "\n  },\n  \"weight_map\": {");
  bool first = true;
  for (const auto& [name, shard] : sorted) {
    CatAppend(&json, first ? "\n" : ",\n", "    ", JsonQuote(name), ": ",
              JsonQuote(file_names_[shard]));
    first = false;
  }
  json += "\n  }\n}\n";
  return leantron::fs::WriteFileAtomically(index_path.string(), json);
}

}  // namespace leantron::ckpt
