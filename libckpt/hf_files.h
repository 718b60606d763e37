// HuggingFace model folders: one model.safetensors, or shards model-0000k-of-0000n.safetensors
// named by model.safetensors.index.json {"metadata": {"total_size"}, "weight_map": {name: file}}.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/safetensors.h"
#include "libckpt/safetensors_writer.h"

namespace leantron::ckpt {

inline constexpr char kHfSingleFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";
inline constexpr uint64_t kHfDefaultMaxShardBytes = 5'000'000'000;

// Every tensor of a HF folder, mapped.
class HfTensorFiles {
 public:
  static absl::StatusOr<std::unique_ptr<HfTensorFiles>> Open(const std::string& dir);
  // NotFound names the folder and tensor.
  absl::StatusOr<TensorView> Get(std::string_view name) const;
  bool Contains(std::string_view name) const;
  void Release(std::string_view name, const TensorView& view) const;
  std::vector<std::string> Names() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, size_t> file_of_;
};

// Streams tensors into a HF folder, split into shards of at most `max_shard_bytes` (a larger
// tensor gets a shard of its own), with the index when there is more than one shard.
class HfShardedWriter {
 public:
  static absl::StatusOr<std::unique_ptr<HfShardedWriter>> Create(const std::string& dir,
                                                                 std::vector<TensorSpec> tensors,
                                                                 uint64_t max_shard_bytes);
  absl::Status Write(std::string_view name, std::span<const std::byte> data);
  absl::Status Finish();
  const std::vector<std::string>& file_names() const { return file_names_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsWriter>> shards_;
  std::vector<std::string> file_names_;
  absl::flat_hash_map<std::string, size_t> shard_of_;
  uint64_t total_size_ = 0;
};

}  // namespace leantron::ckpt
