#include "libckpt/checkpoint_writer.h"

#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "libckpt/checkpoint_verify.h"
#include "libckpt/strings.h"
#include "libfs/atomic_file.h"

namespace leantron::ckpt {
namespace {

namespace fs = std::filesystem;

std::vector<TensorSpec> ShardSpecs(const ModelLayout& layout, int pp_rank, TensorKind kind) {
  const DType dtype = kind == TensorKind::kParam ? layout.config().params_dtype : DType::kF32;
  std::vector<TensorSpec> specs;
  for (const ParamSpec* spec : layout.StageParams(pp_rank)) {
    std::vector<int64_t> shape = layout.ShardShape(*spec);
    specs.push_back({StoredTensorName(spec->name, kind), dtype, {shape.begin(), shape.end()}});
  }
  return specs;
}

std::vector<TensorSpec> OptimizerSpecs(const ModelLayout& layout, int pp_rank) {
  std::vector<TensorSpec> specs;
  for (TensorKind kind : kOptimizerKinds) {
    for (TensorSpec& spec : ShardSpecs(layout, pp_rank, kind)) specs.push_back(std::move(spec));
  }
  return specs;
}

// A shard file names its rank and stores every tensor's checksum (checkpoint_verify.h).
absl::StatusOr<std::unique_ptr<SafetensorsWriter>> CreateShardWriter(const std::string& path,
                                                                     std::vector<TensorSpec> specs,
                                                                     int tp_rank, int pp_rank) {
  return SafetensorsWriter::Create(path, std::move(specs),
                                   {{"format", "pt"},
                                    {kShardTpRankKey, std::to_string(tp_rank)},
                                    {kShardPpRankKey, std::to_string(pp_rank)}},
                                   /*checksums=*/true);
}

absl::Status MakeDirs(const fs::path& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(Cat(dir.string(), ": cannot create: ", error.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSaveDestination(const std::string& checkpoint_dir, int64_t iteration,
                                  bool overwrite) {
  std::error_code error;
  if (overwrite || !fs::exists(checkpoint_dir, error)) return absl::OkStatus();
  if (!fs::is_directory(checkpoint_dir, error)) {
    return absl::FailedPreconditionError(
        Cat(checkpoint_dir, ": exists and is not a directory; choose another --save"));
  }
  if (fs::is_empty(checkpoint_dir, error)) return absl::OkStatus();
  const std::string hint = " (--overwrite replaces it)";
  if (!fs::exists(fs::path(checkpoint_dir) / kTrackerFileName, error)) {
    return absl::FailedPreconditionError(
        Cat(checkpoint_dir, ": not empty and not a checkpoint directory", hint));
  }
  auto latest = ReadLatestIteration(checkpoint_dir);
  if (!latest.ok()) {
    return absl::FailedPreconditionError(Cat(latest.status().message(), hint));
  }
  if (fs::exists(fs::path(checkpoint_dir) / IterationDirName(iteration), error)) {
    return absl::FailedPreconditionError(
        Cat(checkpoint_dir, " already holds ", IterationDirName(iteration), hint));
  }
  if (iteration <= *latest) {
    return absl::FailedPreconditionError(Cat(checkpoint_dir, "'s latest iteration is ", *latest,
                                             "; saving iteration ", iteration,
                                             " there would move its tracker back", hint));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PrepareCheckpointSave(const std::string& checkpoint_dir,
                                                  int64_t iteration) {
  const fs::path temp = fs::path(checkpoint_dir) / (IterationDirName(iteration) + ".tmp");
  std::error_code error;
  fs::remove_all(temp, error);
  if (error) return absl::InternalError(Cat(temp.string(), ": cannot remove: ", error.message()));
  if (auto s = MakeDirs(temp); !s.ok()) return s;
  return temp.string();
}

absl::Status WriteRankShard(const std::string& temp_dir, const ModelLayout& layout, int tp_rank,
                            int pp_rank, const std::vector<RankTensor>& params,
                            const std::vector<RankTensor>* main_params,
                            const std::vector<RankTensor>* exp_avg,
                            const std::vector<RankTensor>* exp_avg_sq) {
  const fs::path shard_dir = fs::path(temp_dir) / layout.ShardDirName(tp_rank, pp_rank);
  if (auto s = MakeDirs(shard_dir); !s.ok()) return s;
  auto write = [&](const char* file_name, std::vector<TensorSpec> specs,
                   std::vector<std::pair<TensorKind, const std::vector<RankTensor>*>> groups) {
    auto writer =
        CreateShardWriter((shard_dir / file_name).string(), std::move(specs), tp_rank, pp_rank);
    if (!writer.ok()) return writer.status();
    for (auto [kind, tensors] : groups) {
      for (const RankTensor& tensor : *tensors) {
        if (auto s = (*writer)->Write(StoredTensorName(tensor.name, kind), tensor.data); !s.ok()) {
          return s;
        }
      }
    }
    return (*writer)->Finish();  // Names a tensor the rank failed to provide.
  };
  if (auto s = write(kModelFileName, ShardSpecs(layout, pp_rank, TensorKind::kParam),
                     {{TensorKind::kParam, &params}});
      !s.ok()) {
    return s;
  }
  if (main_params == nullptr) return absl::OkStatus();
  if (exp_avg == nullptr || exp_avg_sq == nullptr) {
    return absl::InvalidArgumentError("optimizer state needs main params, exp_avg and exp_avg_sq");
  }
  return write(kOptimizerFileName, OptimizerSpecs(layout, pp_rank),
               {{TensorKind::kMainParam, main_params},
                {TensorKind::kExpAvg, exp_avg},
                {TensorKind::kExpAvgSq, exp_avg_sq}});
}

absl::Status CommitCheckpointSave(const std::string& checkpoint_dir, const std::string& temp_dir,
                                  const CheckpointMetadata& metadata,
                                  const SaveProgress& progress) {
  auto step = [&](std::string_view name) {
    if (progress) progress(name);
  };
  auto layout = ModelLayout::Create(metadata.config, metadata.parallel);
  if (!layout.ok()) return layout.status();
  CheckpointMetadata saved = metadata;
  saved.checksums = true;  // Every shard writer above stores them.
  if (auto s = leantron::fs::WriteFileAtomically((fs::path(temp_dir) / kMetadataFileName).string(),
                                                 CheckpointMetadataToJson(saved, *layout));
      !s.ok()) {
    return s;
  }
  step("metadata");
  for (int pp = 0; pp < metadata.parallel.pp; ++pp) {
    for (int tp = 0; tp < metadata.parallel.tp; ++tp) {
      const fs::path shard_dir = fs::path(temp_dir) / layout->ShardDirName(tp, pp);
      for (bool optimizer : {false, true}) {
        if (optimizer && !metadata.has_optimizer) continue;
        const std::string path = (shard_dir / (optimizer ? kOptimizerFileName : kModelFileName));
        auto file = SafetensorsFile::Open(path);
        if (!file.ok()) return file.status();
        if (auto s = VerifyShardFile(*layout, tp, pp, optimizer, **file); !s.ok()) return s;
      }
      if (auto s = leantron::fs::FsyncPath(shard_dir.string()); !s.ok()) return s;
    }
  }
  if (auto s = leantron::fs::FsyncPath(temp_dir); !s.ok()) return s;
  step("verified");
  return PublishIteration(checkpoint_dir, temp_dir, metadata.iteration, progress);
}

absl::Status PublishIteration(const std::string& checkpoint_dir, const std::string& temp_dir,
                              int64_t iteration, const SaveProgress& progress) {
  auto step = [&](std::string_view name) {
    if (progress) progress(name);
  };
  const fs::path final_dir = fs::path(checkpoint_dir) / IterationDirName(iteration);
  if (fs::exists(final_dir)) {
    // Re-saving an iteration: swap atomically so a complete copy exists at every instant.
    if (::renameat2(AT_FDCWD, temp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) !=
        0) {
      return absl::InternalError(
          Cat(final_dir.string(), ": exchange failed: ", std::strerror(errno)));
    }
    std::error_code error;
    fs::remove_all(temp_dir, error);  // Now holds the replaced copy.
  } else if (::rename(temp_dir.c_str(), final_dir.c_str()) != 0) {
    return absl::InternalError(Cat(final_dir.string(), ": rename failed: ", std::strerror(errno)));
  }
  if (auto s = leantron::fs::FsyncPath(checkpoint_dir); !s.ok()) return s;
  step("renamed");
  if (auto s = leantron::fs::WriteFileAtomically(
          (fs::path(checkpoint_dir) / kTrackerFileName).string(),
          iteration < 0 ? std::string("release") : std::to_string(iteration));
      !s.ok()) {
    return s;
  }
  step("tracker");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(
    const std::string& checkpoint_dir, const CheckpointMetadata& metadata) {
  auto layout = ModelLayout::Create(metadata.config, metadata.parallel);
  if (!layout.ok()) return layout.status();
  if (auto s = MakeDirs(checkpoint_dir); !s.ok()) return s;
  auto temp = PrepareCheckpointSave(checkpoint_dir, metadata.iteration);
  if (!temp.ok()) return temp.status();
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(metadata, *std::move(layout)));
  writer->checkpoint_dir_ = checkpoint_dir;
  writer->temp_dir_ = *temp;
  const ParallelConfig& p = metadata.parallel;
  writer->model_writers_.resize(p.pp);
  writer->optimizer_writers_.resize(p.pp);
  for (int pp = 0; pp < p.pp; ++pp) {
    for (int tp = 0; tp < p.tp; ++tp) {
      const fs::path shard_dir = fs::path(*temp) / writer->layout_.ShardDirName(tp, pp);
      if (auto s = MakeDirs(shard_dir); !s.ok()) return s;
      auto model = CreateShardWriter((shard_dir / kModelFileName).string(),
                                     ShardSpecs(writer->layout_, pp, TensorKind::kParam), tp, pp);
      if (!model.ok()) return model.status();
      writer->model_writers_[pp].push_back(*std::move(model));
      if (metadata.has_optimizer) {
        auto optimizer = CreateShardWriter((shard_dir / kOptimizerFileName).string(),
                                           OptimizerSpecs(writer->layout_, pp), tp, pp);
        if (!optimizer.ok()) return optimizer.status();
        writer->optimizer_writers_[pp].push_back(*std::move(optimizer));
      }
    }
  }
  return writer;
}

absl::Status CheckpointWriter::BeginFull(const ParamSpec& spec, TensorKind kind) {
  if (streaming_.spec != nullptr) {
    return absl::FailedPreconditionError(Cat("checkpoint writer: '", streaming_.spec->name,
                                             "' is not complete before '", spec.name, "'"));
  }
  const ParamSpec* own = layout_.Find(spec.name);
  if (own == nullptr || own->shape != spec.shape) {
    return absl::InvalidArgumentError(Cat("checkpoint writer: '", spec.name,
                                          "' is not a parameter of this layout with that shape"));
  }
  if (kind != TensorKind::kParam && !metadata_.has_optimizer) {
    return absl::FailedPreconditionError("checkpoint writer: saving without optimizer state");
  }
  const DType dtype = kind == TensorKind::kParam ? metadata_.config.params_dtype : DType::kF32;
  streaming_ = {.spec = own,
                .targets = {own},
                .kind = kind,
                .element_size = DTypeSize(dtype),
                .at = 0,
                .size = static_cast<size_t>(NumElements(own->shape)) * DTypeSize(dtype)};
  for (const ParamSpec& copy : layout_.params()) {
    if (copy.tied_to == own->name) streaming_.targets.push_back(&copy);
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::AppendFull(std::span<const std::byte> piece) {
  if (streaming_.spec == nullptr) {
    return absl::FailedPreconditionError("checkpoint writer: AppendFull without BeginFull");
  }
  if (piece.size() > streaming_.size - streaming_.at) {
    const std::string name = streaming_.spec->name;
    streaming_ = {};
    return absl::InvalidArgumentError(
        Cat("checkpoint writer: '", name, "' gets more bytes than its shape holds"));
  }
  for (const ParamSpec* target : streaming_.targets) {
    if (auto s = AppendShards(*target, piece, streaming_.at); !s.ok()) return s;
  }
  streaming_.at += piece.size();
  return absl::OkStatus();
}

absl::Status CheckpointWriter::EndFull() {
  const Streaming done = std::exchange(streaming_, {});
  if (done.spec == nullptr) {
    return absl::FailedPreconditionError("checkpoint writer: EndFull without BeginFull");
  }
  if (done.at != done.size) {
    return absl::InvalidArgumentError(Cat("checkpoint writer: '", done.spec->name, "' got ",
                                          done.at, " of its ", done.size, " bytes"));
  }
  if (done.size == 0) {  // Nothing was appended: mark the empty shards written.
    for (const ParamSpec* target : done.targets) {
      auto& writers =
          (done.kind != TensorKind::kParam ? optimizer_writers_ : model_writers_)[target->stage];
      for (auto& writer : writers) {
        if (auto s = writer->Append(StoredTensorName(target->name, done.kind), {}); !s.ok()) {
          return s;
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::AppendShards(const ParamSpec& target,
                                            std::span<const std::byte> piece, size_t at) {
  const TensorKind kind = streaming_.kind;
  const size_t element_size = streaming_.element_size;
  const std::string name = StoredTensorName(target.name, kind);
  auto& writers = (kind != TensorKind::kParam ? optimizer_writers_ : model_writers_)[target.stage];
  for (int tp = 0; tp < metadata_.parallel.tp; ++tp) {
    // The piece's bytes of this rank's shard are one contiguous range of it: a view of the piece
    // when they are one run of it, else gathered.
    size_t runs = 0, first = 0, bytes = 0;
    layout_.ForEachRunIn(target, tp, element_size, at, at + piece.size(),
                         [&](size_t full_at, size_t, size_t n) {
                           if (runs++ == 0) first = full_at - at;
                           bytes += n;
                         });
    if (runs == 0) continue;
    std::span<const std::byte> data = piece.subspan(first, bytes);
    if (runs > 1) {
      shard_buffer_.resize(bytes);
      size_t shard_begin = SIZE_MAX;
      layout_.ForEachRunIn(target, tp, element_size, at, at + piece.size(),
                           [&](size_t full_at, size_t shard_at, size_t n) {
                             if (shard_begin == SIZE_MAX) shard_begin = shard_at;
                             std::memcpy(shard_buffer_.data() + (shard_at - shard_begin),
                                         piece.data() + (full_at - at), n);
                           });
      data = shard_buffer_;
    }
    if (auto s = writers[tp]->Append(name, data); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Commit(const SaveProgress& progress) {
  for (auto* group : {&model_writers_, &optimizer_writers_}) {
    for (auto& stage : *group) {
      for (auto& writer : stage) {
        if (auto s = writer->Finish(); !s.ok()) return s;
        if (progress) progress("shard");
      }
    }
  }
  return CommitCheckpointSave(checkpoint_dir_, temp_dir_, metadata_, progress);
}

absl::StatusOr<SaveFormat> ParseSaveFormat(std::string_view name) {
  if (name.empty() || name == "leantron") return SaveFormat::kLeantron;
  if (name == "megatron") return SaveFormat::kMegatron;
  return absl::InvalidArgumentError(Cat("unknown save format '", name, "' (leantron or megatron)"));
}

absl::Status SaveCheckpointFrom(FullTensorSource& source, const CheckpointMetadata& metadata,
                                const std::string& checkpoint_dir, const SaveProgress& progress,
                                const ProgressOptions& show_progress) {
  if (metadata.has_optimizer && !source.has_optimizer()) {
    return absl::FailedPreconditionError("cannot save optimizer state: the source has none");
  }
  auto writer = CheckpointWriter::Create(checkpoint_dir, metadata);
  if (!writer.ok()) return writer.status();
  std::vector<TensorKind> kinds = {TensorKind::kParam};
  if (metadata.has_optimizer)
    kinds.insert(kinds.end(), std::begin(kOptimizerKinds), std::end(kOptimizerKinds));
  int64_t total_tensors = 0, total_bytes = 0;
  for (const ParamSpec& spec : (*writer)->layout().params()) {
    if (!spec.tied_to.empty()) continue;
    for (TensorKind kind : kinds) {
      ++total_tensors;
      total_bytes += NumElements(spec.shape) *
                     static_cast<int64_t>(DTypeSize(
                         kind == TensorKind::kParam ? metadata.config.params_dtype : DType::kF32));
    }
  }
  ConversionProgress meter(show_progress, total_tensors, total_bytes);
  CheckpointWriter& out = **writer;
  for (const ParamSpec& spec : out.layout().params()) {
    if (!spec.tied_to.empty()) continue;  // Written together with the parameter it copies.
    for (TensorKind kind : kinds) {
      const DType expected =
          kind == TensorKind::kParam ? metadata.config.params_dtype : DType::kF32;
      // Piece by piece from source to shards: with a streaming source (TpShardSource) no full
      // tensor is ever in memory, and each piece is still in the CPU's cache when it is written.
      if (auto s = out.BeginFull(spec, kind); !s.ok()) return s;
      int64_t bytes = 0;
      auto begin = [&](DType dtype) {
        if (dtype == expected) return absl::OkStatus();
        return absl::InvalidArgumentError(Cat("'", spec.name, "' is ", DTypeName(dtype),
                                              " but the checkpoint stores ", DTypeName(expected)));
      };
      auto append = [&](std::span<const std::byte> piece) {
        bytes += static_cast<int64_t>(piece.size());
        return out.AppendFull(piece);
      };
      const FullTensorSink sink = {begin, append};
      if (auto s = source.StreamFull(spec, kind, sink); !s.ok()) return s;
      if (auto s = out.EndFull(); !s.ok()) return s;
      meter.Add(1, bytes);
    }
  }
  meter.Done();
  return (*writer)->Commit(progress);
}

}  // namespace leantron::ckpt
