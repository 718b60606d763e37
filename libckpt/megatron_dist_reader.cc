// Megatron's `torch_dist` checkpoint format (megatron_reader.h).
#include "libckpt/megatron_dist_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libckpt/megatron_args.h"
#include "libckpt/megatron_layout.h"
#include "libckpt/megatron_reader.h"
#include "libckpt/strings.h"
#include "libckpt/torch_archive.h"
#include "libckpt/torch_dist_metadata.h"

namespace leantron::ckpt {

namespace stdfs = std::filesystem;

// "<int><rest>" after `prefix` at the start of `s`.
static std::optional<std::pair<int64_t, std::string_view>> IntAfter(std::string_view s,
                                                                    std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return std::nullopt;
  s.remove_prefix(prefix.size());
  size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  int64_t v = 0;
  if (n == 0 || !absl::SimpleAtoi(ToAbsl(s.substr(0, n)), &v)) return std::nullopt;
  return std::make_pair(v, s.substr(n));
}

absl::Status MegatronDistReader::MapTensors(const MegatronRun& run) {
  const ModelConfig& c = metadata_.config;
  const ParallelConfig& p = metadata_.parallel;
  auto bad = [&](const std::string& key, std::string_view why) {
    return absl::DataLossError(Cat(dir_, ": tensor '", key, "' ", why));
  };
  // (dp_group_idx, gbuf_idx, bucket_idx, state) -> tensor, for the distributed optimizer's buckets.
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>,
           std::pair<std::string, const DcpTensorInfo*>>
      bucket_tensors;
  bool any_optimizer = false;
  for (const auto& [key, info] : md_.tensors) {
    if (absl::StrContains(key, "_extra_state")) continue;
    TensorKind kind = TensorKind::kParam;
    std::string_view model_key = key;
    if (absl::StartsWith(key, "optimizer.distributed.")) {
      any_optimizer = true;
      auto group = IntAfter(key, "optimizer.distributed.dp_group_idx_");
      auto gbuf = group ? IntAfter(group->second, ".gbuf_idx_") : std::nullopt;
      const size_t at = key.rfind(".bucket_idx_");
      auto bucket = at == std::string::npos
                        ? std::nullopt
                        : IntAfter(std::string_view(key).substr(at), ".bucket_idx_");
      if (!gbuf || !bucket || bucket->second.size() < 2 || bucket->second[0] != '.') {
        return bad(key, "is not a distributed-optimizer bucket this reader knows");
      }
      bucket_tensors[{group->first, gbuf->first, bucket->first,
                      std::string(bucket->second.substr(1))}] = {key, &info};
      continue;
    }
    if (absl::StartsWith(key, "optimizer.state.")) {
      any_optimizer = true;
      std::string_view rest =
          std::string_view(key).substr(std::string_view("optimizer.state.").size());
      const size_t dot = rest.find('.');
      const std::string_view state = rest.substr(0, dot);
      if (state == "fp32_param" || state == "param") {
        kind = TensorKind::kMainParam;
      } else if (state == "exp_avg") {
        kind = TensorKind::kExpAvg;
      } else if (state == "exp_avg_sq") {
        kind = TensorKind::kExpAvgSq;
      } else {
        return bad(key, Cat("holds optimizer state '", state, "', which Adam does not have"));
      }
      model_key = dot == std::string_view::npos ? "" : rest.substr(dot + 1);
    } else if (absl::StartsWith(key, "optimizer.") || absl::StartsWith(key, "chained_")) {
      return bad(key, "belongs to an optimizer layout this reader does not know");
    }
    const std::optional<DistKeyTarget> target = CanonicalFromDistKey(model_key);
    if (!target) return bad(key, "is not part of a GPT model");
    const DType dtype = kind == TensorKind::kParam ? c.params_dtype : DType::kF32;
    if (info.dtype != dtype) {
      return bad(key, Cat("is ", DTypeName(info.dtype), ", expected ", DTypeName(dtype)));
    }
    const int layers = target->stacked ? static_cast<int>(c.num_layers) : 1;
    if (target->stacked && (info.shape.empty() || info.shape[0] != c.num_layers)) {
      return bad(key, Cat("stacks ", info.shape.empty() ? 0 : info.shape[0], " layers, not ",
                          c.num_layers));
    }
    for (int layer = 0; layer < layers; ++layer) {
      const std::string name =
          target->stacked ? Cat("decoder.layers.", layer, ".", target->name) : target->name;
      const ParamSpec* spec = layout_.Find(name);
      if (spec != nullptr && !spec->tied_to.empty()) continue;  // A tied copy: read the original.
      if (spec == nullptr) return bad(key, Cat("maps to '", name, "', which this model lacks"));
      std::vector<int64_t> shape(info.shape.begin() + (target->stacked ? 1 : 0), info.shape.end());
      if (shape != spec->shape) {
        return bad(key, Cat("has shape [", absl::StrJoin(info.shape, ","), "]; '", name, "' is [",
                            absl::StrJoin(spec->shape, ","), "] in the saved layout"));
      }
      if (!entries_[static_cast<int>(kind)]
               .emplace(name, DistEntry{&info, key, target->stacked ? layer : -1})
               .second) {
        return bad(key, Cat("is a second copy of '", name, "'"));
      }
    }
  }
  // The distributed optimizer's bucket space: each (TP, PP) rank's chunks in Megatron's buffer
  // layout, one tensor per bucket and state.
  if (!bucket_tensors.empty()) {
    for (int pp = 0; pp < p.pp; ++pp) {
      for (int tp = 0; tp < p.tp; ++tp) {
        const int64_t group = static_cast<int64_t>(pp) * p.tp + tp;
        for (int v = 0; v < p.vpp; ++v) {
          const std::optional<int64_t> bucket_size =
              v > 0 || pp > 0 || run.overlap_param_gather_with_optimizer_step ? std::nullopt
                                                                              : run.bucket_size;
          const BufferLayout flat =
              MegatronBufferLayout(layout_, pp, v, bucket_size, run.data_parallel_size);
          for (auto [kind, state] : {std::pair{TensorKind::kMainParam, "param"},
                                     {TensorKind::kExpAvg, "exp_avg"},
                                     {TensorKind::kExpAvgSq, "exp_avg_sq"}}) {
            for (size_t b = 0; b < flat.bucket_unpadded.size(); ++b) {
              auto it = bucket_tensors.find({group, v, static_cast<int64_t>(b), state});
              if (it == bucket_tensors.end()) {
                return absl::DataLossError(Cat(dir_, ": no distributed-optimizer bucket ", b,
                                               " of '", state, "' for TP rank ", tp, ", PP rank ",
                                               pp, " (dp_group_idx_", group, ")"));
              }
              const DcpTensorInfo& info = *it->second.second;
              if (info.shape != std::vector<int64_t>{flat.bucket_unpadded[b]}) {
                return bad(it->second.first,
                           Cat("holds [", absl::StrJoin(info.shape, ","),
                               "] elements; the model's "
                               "buffer layout gives ",
                               flat.bucket_unpadded[b], " (different --ddp-bucket-size?)"));
              }
            }
            for (const BufferParam& param : flat.params) {
              if (!param.spec->tied_to.empty()) continue;
              const auto& [key, info] =
                  bucket_tensors[{group, v, static_cast<int64_t>(param.bucket), state}];
              std::vector<BucketSlice>& slices = buckets_[static_cast<int>(kind)][param.spec->name];
              slices.resize(p.tp);
              slices[tp] = {info, key, param.bucket_offset};
            }
          }
        }
      }
    }
  }
  // Every parameter present; the optimizer complete when any of it is there.
  for (const ParamSpec& spec : layout_.params()) {
    if (!spec.tied_to.empty()) continue;
    if (!entries_[0].contains(spec.name)) {
      return absl::DataLossError(Cat(dir_, ": no tensor for '", spec.name, "'"));
    }
    if (run.fp32_training && !entries_[1].contains(spec.name) && !buckets_[1].contains(spec.name)) {
      entries_[1][spec.name] = entries_[0][spec.name];  // fp32 runs keep no separate main copy
    }
  }
  metadata_.has_optimizer = any_optimizer;
  if (any_optimizer) {
    for (TensorKind kind : kOptimizerKinds) {
      const int k = static_cast<int>(kind);
      for (const ParamSpec& spec : layout_.params()) {
        if (spec.tied_to.empty() && !entries_[k].contains(spec.name) &&
            !buckets_[k].contains(spec.name)) {
          return absl::DataLossError(
              Cat(dir_, ": no optimizer state ", StoredTensorName(spec.name, kind)));
        }
      }
    }
  }
  return absl::OkStatus();
}

// Adam's step in Megatron's common state: a non-distributed optimizer's `common_step`, or the
// `step` of the first param group (torch AdamW without Apex / TE; FusedAdam).
static std::optional<int64_t> FindStep(const TorchArchive& archive, const PyValue* v, int depth) {
  if (v == nullptr || depth > 5) return std::nullopt;
  auto scalar = [&](const PyValue* s) -> std::optional<int64_t> {
    if (s == nullptr) return std::nullopt;
    if (s->kind == PyKind::kInt) return s->integer;
    if (s->kind == PyKind::kFloat) return static_cast<int64_t>(s->real);
    if (TorchArchive::IsTensor(s)) {
      auto t = archive.Tensor(s, "step");
      if (t.ok() && t->data.size() == DTypeSize(t->dtype)) {
        if (auto d = ElementAsDouble(t->dtype, t->data.data(), 0)) return static_cast<int64_t>(*d);
        if (t->dtype == DType::kI64) {
          int64_t i;
          std::memcpy(&i, t->data.data(), 8);
          return i;
        }
      }
    }
    return std::nullopt;
  };
  if (v->kind == PyKind::kList || v->kind == PyKind::kTuple) {
    for (const PyValue* item : v->items) {
      if (auto s = FindStep(archive, item, depth + 1)) return s;
    }
    return std::nullopt;
  }
  if (v->kind != PyKind::kDict) return std::nullopt;
  if (auto s = scalar(DictGet(v, "common_step"))) return s;
  if (const PyValue* groups = DictGet(v, "param_groups");
      groups != nullptr && groups->kind == PyKind::kList && !groups->items.empty()) {
    if (auto s = scalar(DictGet(groups->items[0], "step"))) return s;
  }
  for (size_t i = 1; i < v->items.size(); i += 2) {
    if (auto s = FindStep(archive, v->items[i], depth + 1)) return s;
  }
  return std::nullopt;
}

void MegatronDistReader::DescribeFiles(std::ostream& out) const {
  std::map<std::string, std::pair<int64_t, int64_t>> per_file;  // chunks, bytes items
  for (const auto& [key, info] : md_.tensors) {
    for (const DcpChunk& chunk : info.chunks) ++per_file[chunk.storage.file].first;
  }
  for (const auto& [key, storage] : md_.bytes) ++per_file[storage.file].second;
  std::error_code error;
  out << absl::StrFormat("  %-40s %12d bytes %5d tensors %d objects\n", ".metadata",
                         stdfs::file_size(stdfs::path(dir_) / ".metadata", error),
                         md_.tensors.size(), md_.bytes.size());
  for (const auto& [file, counts] : per_file) {
    out << absl::StrFormat("  %-40s %12d bytes %5d chunks  %d objects\n", file,
                           stdfs::file_size(stdfs::path(dir_) / file, error), counts.first,
                           counts.second);
  }
}

absl::StatusOr<std::unique_ptr<CheckpointSource>> MegatronDistReader::Open(
    const std::string& iteration_dir, CheckpointReadOptions options) {
  const std::string md_path = (stdfs::path(iteration_dir) / ".metadata").string();
  auto md_file = MappedFile::Open(md_path);
  if (!md_file.ok()) return md_file.status();
  auto md = ParseDcpMetadata((*md_file)->bytes(), md_path);
  if (!md.ok()) return md.status();
  // The non-tensor state: a `common_state` item (current Megatron) or common.pt (older).
  std::unique_ptr<TorchArchive> common_archive;
  const PyValue* common = nullptr;
  auto common_item = std::find_if(md->bytes.begin(), md->bytes.end(), [](const auto& item) {
    return absl::StartsWith(item.first, "common_state");
  });
  if (common_item != md->bytes.end()) {
    auto file = MappedFile::Open((stdfs::path(iteration_dir) / common_item->second.file).string());
    if (!file.ok()) return file.status();
    auto archive =
        TorchArchive::OpenSlice(*file, common_item->second.offset, common_item->second.length);
    if (!archive.ok()) return archive.status();
    common_archive = *std::move(archive);
    const PyValue* list = common_archive->root();
    if (list->kind == PyKind::kList && list->items.size() == 1) common = list->items[0];
  } else {
    auto archive = TorchArchive::Open((stdfs::path(iteration_dir) / "common.pt").string());
    if (!archive.ok()) {
      return absl::DataLossError(Cat(
          iteration_dir, ": no common_state item and no common.pt: ", archive.status().message()));
    }
    common_archive = *std::move(archive);
    common = common_archive->root();
  }
  if (common == nullptr || common->kind != PyKind::kDict) {
    return absl::DataLossError(Cat(common_archive->source(), ": common state is ",
                                   PyRepr(common_archive->root(), 80), ", not a dict"));
  }
  auto run = MegatronRunFromArgs(DictGet(common, "args"), common_archive->source());
  if (!run.ok()) return run.status();
  auto layout = ModelLayout::Create(run->config, run->parallel);
  if (!layout.ok()) {
    return absl::DataLossError(Cat(common_archive->source(), ": ", layout.status().message()));
  }
  CheckpointMetadata metadata;
  metadata.config = run->config;
  metadata.parallel = run->parallel;
  const PyValue* iteration = DictGet(common, "iteration");
  metadata.iteration = iteration != nullptr && iteration->kind == PyKind::kInt ? iteration->integer
                       : stdfs::path(iteration_dir).filename() == "release"    ? -1
                                                                               : 0;
  metadata.consumed_samples = run->consumed_samples;
  metadata.args_json = run->args_json;
  std::unique_ptr<MegatronDistReader> reader(
      new MegatronDistReader(std::move(metadata), *std::move(layout)));
  reader->iteration_dir_ = iteration_dir;
  reader->dir_ = iteration_dir;
  reader->verify_ = options.verify;
  reader->md_ = *std::move(md);
  if (auto s = reader->MapTensors(*run); !s.ok()) return s;
  if (reader->metadata_.has_optimizer) {
    std::optional<int64_t> step = FindStep(*common_archive, DictGet(common, "optimizer"), 0);
    if (!step) {
      // A distributed optimizer keeps its param groups in per-rank items.
      for (const auto& [key, storage] : reader->md_.bytes) {
        if (!absl::StartsWith(key, "optimizer.distributed.dp_group_idx_0.optimizer")) continue;
        auto archive = reader->Item(storage);
        if (archive.ok()) step = FindStep(**archive, (*archive)->root(), 0);
        break;
      }
    }
    reader->metadata_.optimizer_step =
        step.value_or(std::max<int64_t>(0, reader->metadata_.iteration));
  }
  return std::unique_ptr<CheckpointSource>(std::move(reader));
}

absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenMegatronDistCheckpoint(
    const std::string& iteration_dir, CheckpointReadOptions options) {
  return MegatronDistReader::Open(iteration_dir, options);
}

}  // namespace leantron::ckpt
