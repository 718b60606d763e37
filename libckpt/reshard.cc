#include "libckpt/reshard.h"

#include <filesystem>

#include "libckpt/checkpoint_source.h"
#include "libckpt/checkpoint_writer.h"
#include "libckpt/megatron_writer.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {

absl::StatusOr<RankState> LoadRankState(const std::string& checkpoint_dir,
                                        std::optional<int64_t> iteration,
                                        const ParallelConfig& target, int tp_rank, int pp_rank) {
  auto reader = OpenCheckpoint(checkpoint_dir, iteration);
  if (!reader.ok()) return reader.status();
  auto layout = ModelLayout::Create((*reader)->metadata().config, target);
  if (!layout.ok()) return layout.status();
  if (tp_rank < 0 || tp_rank >= target.tp || pp_rank < 0 || pp_rank >= target.pp) {
    return absl::InvalidArgumentError(
        Cat("rank (tp ", tp_rank, ", pp ", pp_rank, ") is outside the target layout"));
  }
  RankState state;
  state.metadata = (*reader)->metadata();
  state.metadata.parallel = target;
  std::vector<std::pair<TensorKind, std::vector<NamedTensor>*>> kinds = {
      {TensorKind::kParam, &state.params}};
  if (state.metadata.has_optimizer) {
    kinds.push_back({TensorKind::kMainParam, &state.main_params});
    kinds.push_back({TensorKind::kExpAvg, &state.exp_avg});
    kinds.push_back({TensorKind::kExpAvgSq, &state.exp_avg_sq});
  }
  Tensor full;
  for (const ParamSpec* spec : layout->StageParams(pp_rank)) {
    for (auto [kind, out] : kinds) {
      if (auto s = (*reader)->ReadFull(*spec, kind, &full); !s.ok()) return s;
      NamedTensor shard{spec->name, {}};
      shard.tensor.Reset(full.dtype, layout->ShardShape(*spec));
      layout->ExtractShard(*spec, tp_rank, DTypeSize(full.dtype), full.bytes(),
                           shard.tensor.mutable_bytes());
      out->push_back(std::move(shard));
    }
  }
  return state;
}

absl::Status ReshardCheckpoint(const std::string& load_dir, const std::string& save_dir,
                               const ReshardOptions& options) {
  std::error_code error;
  if (std::filesystem::equivalent(load_dir, save_dir, error)) {
    return absl::InvalidArgumentError("--save must differ from --load");
  }
  auto reader = OpenCheckpoint(load_dir, options.iteration,
                               {.verify = options.verify, .format = options.load_format});
  if (!reader.ok()) return reader.status();
  CheckpointMetadata metadata = (*reader)->metadata();
  metadata.parallel = options.target;
  if (auto s = CheckSaveDestination(save_dir, metadata.iteration, options.overwrite); !s.ok()) {
    return s;
  }
  // Validate the target before creating anything on disk.
  if (auto layout = ModelLayout::Create(metadata.config, metadata.parallel); !layout.ok()) {
    return layout.status();
  }
  const bool existed = std::filesystem::exists(save_dir, error);
  absl::Status status;
  if (options.save_format == SaveFormat::kMegatron) {
    MegatronSaveOptions save;
    save.distributed_optimizer =
        options.distributed_optimizer.value_or(UsesDistributedOptimizer(metadata.args_json));
    save.progress = options.progress;
    status = SaveMegatronCheckpoint(**reader, metadata, save_dir, save);
  } else {
    status = SaveCheckpointFrom(**reader, metadata, save_dir, nullptr, options.progress);
  }
  if (!status.ok()) {
    // A source found broken halfway (a record failing its CRC) leaves nothing behind: not the
    // half-written iteration, nor the directory this call created.
    std::filesystem::remove_all(
        std::filesystem::path(save_dir) / (IterationDirName(metadata.iteration) + ".tmp"), error);
    if (!existed && std::filesystem::is_empty(save_dir, error)) {
      std::filesystem::remove(save_dir, error);
    }
  }
  return status;
}

}  // namespace leantron::ckpt
