#include "libckpt/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libckpt/checkpoint_verify.h"
#include "libckpt/strings.h"
#include "libfs/atomic_file.h"

namespace leantron::ckpt {

absl::Status VerifyShardFile(const ModelLayout& layout, int tp_rank, int pp_rank, bool optimizer,
                             const SafetensorsFile& file) {
  const DType dtype = optimizer ? DType::kF32 : layout.config().params_dtype;
  absl::flat_hash_set<std::string> expected;
  for (const ParamSpec* spec : layout.StageParams(pp_rank)) {
    std::vector<TensorKind> kinds = {TensorKind::kParam};
    if (optimizer) kinds.assign(std::begin(kOptimizerKinds), std::end(kOptimizerKinds));
    const std::vector<int64_t> shape = layout.ShardShape(*spec);
    for (TensorKind kind : kinds) {
      const std::string name = StoredTensorName(spec->name, kind);
      expected.insert(name);
      const TensorInfo* info = file.Find(name);
      if (info == nullptr) {
        return absl::DataLossError(Cat(file.path(), ": tensor '", name, "' is missing"));
      }
      std::vector<int64_t> got(info->shape.begin(), info->shape.end());
      if (got != shape) {
        return absl::DataLossError(Cat(file.path(), ": tensor '", name, "' has shape [",
                                       absl::StrJoin(got, ","), "], the layout expects [",
                                       absl::StrJoin(shape, ","), "]"));
      }
      if (info->dtype != dtype) {
        return absl::DataLossError(Cat(file.path(), ": tensor '", name, "' is ",
                                       DTypeName(info->dtype), ", expected ", DTypeName(dtype)));
      }
    }
  }
  for (const TensorInfo& info : file.tensors()) {
    if (!expected.contains(info.name)) {
      return absl::DataLossError(
          Cat(file.path(), ": unexpected tensor '", info.name, "' for this rank of the layout"));
    }
  }
  return absl::OkStatus();
}

absl::Status FullTensorSource::StreamFull(const ParamSpec& target, TensorKind kind,
                                          const FullTensorSink& sink) {
  if (auto s = ReadFull(target, kind, &stream_buffer_); !s.ok()) return s;
  if (auto s = sink.begin(stream_buffer_.dtype); !s.ok()) return s;
  return sink.append(stream_buffer_.bytes());
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& checkpoint_dir, std::optional<int64_t> iteration,
    CheckpointReadOptions options) {
  namespace stdfs = std::filesystem;
  auto dir = ResolveIterationDir(checkpoint_dir, iteration);
  if (!dir.ok()) return dir.status();
  const std::string metadata_path = (stdfs::path(*dir) / kMetadataFileName).string();
  auto text = fs::ReadFileToString(metadata_path);
  if (!text.ok()) return text.status();
  auto metadata = ParseCheckpointMetadata(*text, metadata_path);
  if (!metadata.ok()) return metadata.status();
  const ParallelConfig& p = metadata->parallel;
  // Open every shard file first: the counts metadata.json claims are checked against what is
  // there before a layout is sized by them (a claimed 10^9 layers must not allocate 10^9 specs).
  std::vector<std::vector<std::unique_ptr<SafetensorsFile>>> model_files(p.pp), optimizer_files;
  if (metadata->has_optimizer) optimizer_files.resize(p.pp);
  int64_t tensors_present = 0;
  for (int pp = 0; pp < p.pp; ++pp) {
    for (int tp = 0; tp < p.tp; ++tp) {
      const stdfs::path shard_dir = stdfs::path(*dir) / ShardDirName(tp, pp, p.pp);
      for (bool optimizer : {false, true}) {
        if (optimizer && !metadata->has_optimizer) continue;
        const std::string path = (shard_dir / (optimizer ? kOptimizerFileName : kModelFileName));
        if (!stdfs::exists(path)) {
          return absl::DataLossError(Cat(path, ": shard file missing (checkpoint is incomplete)"));
        }
        auto file = SafetensorsFile::Open(path);
        if (!file.ok()) return file.status();
        if (!optimizer && tp == 0)
          tensors_present += static_cast<int64_t>((*file)->tensors().size());
        (optimizer ? optimizer_files : model_files)[pp].push_back(*std::move(file));
      }
    }
  }
  if (metadata->config.num_layers > tensors_present) {
    return absl::DataLossError(Cat(metadata_path, ": claims ", metadata->config.num_layers,
                                   " layers but its shard files hold ", tensors_present,
                                   " tensors per tensor-parallel rank"));
  }
  auto layout = ModelLayout::Create(metadata->config, metadata->parallel);
  if (!layout.ok()) return absl::DataLossError(Cat(metadata_path, ": ", layout.status().message()));
  for (int pp = 0; pp < p.pp; ++pp) {
    for (int tp = 0; tp < p.tp; ++tp) {
      if (auto s = VerifyShardFile(*layout, tp, pp, false, *model_files[pp][tp]); !s.ok()) return s;
      if (metadata->has_optimizer) {
        if (auto s = VerifyShardFile(*layout, tp, pp, true, *optimizer_files[pp][tp]); !s.ok()) {
          return s;
        }
      }
    }
  }
  if (options.verify) {
    if (auto s = VerifyCheckpointContent(*metadata, *layout, model_files, optimizer_files);
        !s.ok()) {
      return s;
    }
  }
  std::unique_ptr<CheckpointReader> reader(
      new CheckpointReader(*std::move(metadata), *std::move(layout)));
  reader->iteration_dir_ = *dir;
  reader->model_files_ = std::move(model_files);
  reader->optimizer_files_ = std::move(optimizer_files);
  return reader;
}

void CheckpointReader::DescribeFiles(std::ostream& out) const {
  const ParallelConfig& p = metadata_.parallel;
  for (int pp = 0; pp < p.pp; ++pp) {
    for (int tp = 0; tp < p.tp; ++tp) {
      for (bool optimizer : {false, true}) {
        if (optimizer && !metadata_.has_optimizer) continue;
        const SafetensorsFile& file = shard_file(tp, pp, optimizer);
        std::filesystem::path path(file.path());
        std::error_code error;
        out << absl::StrFormat("  %-40s %12d bytes %5d tensors\n",
                               (path.parent_path().filename() / path.filename()).string(),
                               std::filesystem::file_size(path, error), file.tensors().size());
      }
    }
  }
}

const SafetensorsFile& CheckpointReader::shard_file(int tp_rank, int pp_rank,
                                                    bool optimizer) const {
  return *(optimizer ? optimizer_files_ : model_files_)[pp_rank][tp_rank];
}

absl::Status CheckpointReader::ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) {
  const bool optimizer = kind != TensorKind::kParam;
  if (optimizer && !metadata_.has_optimizer) {
    return absl::FailedPreconditionError(
        Cat(iteration_dir_, ": checkpoint has no optimizer state"));
  }
  const std::string& canonical = target.tied_to.empty() ? target.name : target.tied_to;
  const ParamSpec* source = layout_.Find(canonical);
  if (source == nullptr || !source->tied_to.empty()) {
    return absl::NotFoundError(
        Cat(iteration_dir_, ": checkpoint has no parameter '", canonical, "'"));
  }
  const DType dtype = optimizer ? DType::kF32 : metadata_.config.params_dtype;
  const size_t element_size = DTypeSize(dtype);
  const std::string stored = StoredTensorName(source->name, kind);
  const bool same_shape = source->shape == target.shape;
  if (!same_shape && (source->split != TpSplit::kVocabRows || target.shape.size() != 2 ||
                      source->shape[1] != target.shape[1])) {
    return absl::InvalidArgumentError(Cat(iteration_dir_, ": parameter '", canonical,
                                          "' has shape [", absl::StrJoin(source->shape, ","),
                                          "], requested [", absl::StrJoin(target.shape, ","),
                                          "]: the checkpoint's model config differs"));
  }
  // When TP changes the padded vocabulary, merge into a buffer with room for both row counts and
  // trim afterwards: rows the source lacks stay zero, and no second full-size copy is made.
  std::vector<int64_t> shape = source->shape;
  if (!same_shape) shape[0] = std::max(source->shape[0], target.shape[0]);
  out->Reset(dtype, shape);
  const std::span<std::byte> merged(out->data.data(),
                                    static_cast<size_t>(NumElements(source->shape)) * element_size);
  for (int tp = 0; tp < metadata_.parallel.tp; ++tp) {
    const SafetensorsFile& file = shard_file(tp, source->stage, optimizer);
    auto view = file.Get(stored);
    if (!view.ok()) return view.status();
    // Source pages are dropped as the copy passes them: the mapped shard never adds a whole
    // tensor to the resident set next to `merged`.
    size_t released = 0;
    layout_.InsertShard(*source, tp, element_size, view->data, merged, [&](size_t consumed) {
      file.Release({view->info, view->data.subspan(released, consumed - released)});
      released = consumed;
    });
    file.Release(*view);
    // Replicated tensors are equal on every TP rank; rank 0's copy is the one kept.
    if (source->split == TpSplit::kReplicated) break;
  }
  if (!same_shape) {
    out->shape = target.shape;
    out->data.resize(static_cast<size_t>(NumElements(target.shape)) * element_size);
  }
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
