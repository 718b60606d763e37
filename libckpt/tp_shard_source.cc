#include "libckpt/tp_shard_source.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {

void TpShardSource::AddShard(TensorKind kind, const std::string& name, int tp_rank,
                             ShardRef shard) {
  std::vector<ShardRef>& ranks = shards_[static_cast<int>(kind)][name];
  if (ranks.size() < static_cast<size_t>(metadata_.parallel.tp))
    ranks.resize(metadata_.parallel.tp);
  ranks[tp_rank] = shard;
}

std::optional<std::pair<std::string, int>> TpShardSource::FirstMissing(TensorKind kind) const {
  const auto& by_name = shards_[static_cast<int>(kind)];
  for (const ParamSpec& spec : layout_.params()) {
    if (!spec.tied_to.empty()) continue;
    auto it = by_name.find(spec.name);
    for (int tp = 0; tp < metadata_.parallel.tp; ++tp) {
      if (it == by_name.end() || static_cast<size_t>(tp) >= it->second.size() ||
          it->second[tp].file == nullptr) {
        return std::make_pair(spec.name, tp);
      }
    }
  }
  return std::nullopt;
}

absl::Status TpShardSource::ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) {
  const bool optimizer = kind != TensorKind::kParam;
  if (optimizer && !metadata_.has_optimizer) {
    return absl::FailedPreconditionError(
        Cat(iteration_dir_, ": checkpoint has no optimizer state"));
  }
  const std::string& canonical = target.tied_to.empty() ? target.name : target.tied_to;
  const ParamSpec* source = layout_.Find(canonical);
  const auto& by_name = shards_[static_cast<int>(kind)];
  auto it = by_name.find(canonical);
  if (source == nullptr || !source->tied_to.empty() || it == by_name.end()) {
    return absl::NotFoundError(
        Cat(iteration_dir_, ": checkpoint has no parameter '", canonical, "'"));
  }
  const DType dtype = optimizer ? DType::kF32 : metadata_.config.params_dtype;
  const size_t element_size = DTypeSize(dtype);
  const bool same_shape = source->shape == target.shape;
  if (!same_shape && (source->split != TpSplit::kVocabRows || target.shape.size() != 2 ||
                      source->shape[1] != target.shape[1])) {
    return absl::InvalidArgumentError(Cat(iteration_dir_, ": parameter '", canonical,
                                          "' has shape [", absl::StrJoin(source->shape, ","),
                                          "], requested [", absl::StrJoin(target.shape, ","),
                                          "]: the checkpoint's model config differs"));
  }
  std::vector<int64_t> shape = source->shape;
  if (!same_shape) shape[0] = std::max(source->shape[0], target.shape[0]);
  out->Reset(dtype, shape);
  const std::span<std::byte> merged(out->data.data(),
                                    static_cast<size_t>(NumElements(source->shape)) * element_size);
  // Every rank's record, replicated copies included (only the first is copied).
  if (verify_storages_) {
    for (const ShardRef& shard : it->second) {
      if (shard.archive == nullptr) continue;
      if (auto s = shard.archive->VerifyStorage(shard.storage_key); !s.ok()) return s;
    }
  }
  for (int tp = 0; tp < metadata_.parallel.tp; ++tp) {
    const ShardRef& shard = it->second[tp];
    size_t released = 0;
    layout_.InsertShard(*source, tp, element_size, shard.data, merged, [&](size_t consumed) {
      shard.file->Release(shard.data.subspan(released, consumed - released));
      released = consumed;
    });
    shard.file->Release(shard.data);
    if (source->split == TpSplit::kReplicated) break;
  }
  if (!same_shape) {
    out->shape = target.shape;
    out->data.resize(static_cast<size_t>(NumElements(target.shape)) * element_size);
  }
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
