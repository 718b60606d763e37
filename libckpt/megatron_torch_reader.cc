// Megatron's legacy `torch` checkpoint format (megatron_reader.h).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libckpt/megatron_args.h"
#include "libckpt/megatron_layout.h"
#include "libckpt/megatron_reader.h"
#include "libckpt/strings.h"
#include "libckpt/torch_archive.h"
#include "libckpt/tp_shard_source.h"

namespace leantron::ckpt {
namespace {

namespace stdfs = std::filesystem;

constexpr char kModelFile[] = "model_optim_rng.pt";
constexpr char kDistOptimFile[] = "distrib_optim.pt";

struct RankDir {
  int tp = 0, pp = 0;
  std::string path;
};

// mp_rank_TT or mp_rank_TT_PPP (two or three digits as Megatron names them).
std::optional<std::pair<int, int>> ParseRankDir(std::string_view name, bool* expert) {
  constexpr std::string_view kPrefix = "mp_rank_";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::vector<int> parts;
  for (std::string_view rest = name.substr(kPrefix.size()); !rest.empty();) {
    const size_t end = std::min(rest.find('_'), rest.size());
    int value = 0;
    if (end == 0 || !absl::SimpleAtoi(ToAbsl(rest.substr(0, end)), &value) || value < 0) {
      return std::nullopt;
    }
    parts.push_back(value);
    rest = end < rest.size() ? rest.substr(end + 1) : std::string_view();
  }
  if (parts.empty() || parts.size() > 3) return std::nullopt;
  *expert = parts.size() == 3;
  return std::make_pair(parts[0], parts.size() >= 2 ? parts[1] : 0);
}

absl::StatusOr<std::vector<RankDir>> ListRankDirs(const std::string& iteration_dir, int* tp_size,
                                                  int* pp_size) {
  std::vector<RankDir> ranks;
  std::error_code error;
  bool with_pp = false, without_pp = false;
  for (const auto& entry : stdfs::directory_iterator(iteration_dir, error)) {
    bool expert = false;
    const std::string name = entry.path().filename().string();
    auto rank = ParseRankDir(name, &expert);
    if (!rank || !entry.is_directory()) continue;
    if (expert) {
      return absl::InvalidArgumentError(
          Cat(iteration_dir, "/", name, ": expert-parallel checkpoints are not supported"));
    }
    if (!stdfs::exists(entry.path() / kModelFile)) {
      return absl::DataLossError(
          Cat(entry.path().string(), ": ", kModelFile, " missing (checkpoint is incomplete)"));
    }
    (name.size() > std::string_view("mp_rank_00").size() ? with_pp : without_pp) = true;
    ranks.push_back({rank->first, rank->second, entry.path().string()});
  }
  if (error) return absl::NotFoundError(Cat(iteration_dir, ": cannot list: ", error.message()));
  if (ranks.empty()) {
    return absl::NotFoundError(Cat(iteration_dir, ": no mp_rank_* directories with ", kModelFile));
  }
  if (with_pp && without_pp) {
    return absl::DataLossError(
        Cat(iteration_dir, ": mixes mp_rank_TT and mp_rank_TT_PPP directories"));
  }
  int tp = 0, pp = 0;
  for (const RankDir& r : ranks) {
    tp = std::max(tp, r.tp + 1);
    pp = std::max(pp, r.pp + 1);
  }
  if (static_cast<int64_t>(tp) * pp != static_cast<int64_t>(ranks.size())) {
    return absl::DataLossError(Cat(iteration_dir, ": holds ", ranks.size(),
                                   " rank directories, not a full TP ", tp, " x PP ", pp,
                                   " grid (checkpoint is incomplete)"));
  }
  std::sort(ranks.begin(), ranks.end(), [](const RankDir& a, const RankDir& b) {
    return std::tie(a.pp, a.tp) < std::tie(b.pp, b.tp);
  });
  *tp_size = tp;
  *pp_size = pp;
  return ranks;
}

// Nested state dicts of old Megatron versions ({"language_model": {"encoder": {...}}}) as
// dotted names, in order.
void Flatten(const PyValue* dict, const std::string& prefix, int depth,
             std::vector<std::pair<std::string, const PyValue*>>* out) {
  for (size_t i = 0; i + 1 < dict->items.size(); i += 2) {
    const PyValue* key = dict->items[i];
    const PyValue* value = dict->items[i + 1];
    std::string name = key->kind == PyKind::kStr ? key->s : PyRepr(key, 40);
    if (!prefix.empty()) name = Cat(prefix, ".", name);
    if (value->kind == PyKind::kDict && depth < 4) {
      Flatten(value, name, depth + 1, out);
    } else {
      out->emplace_back(std::move(name), value);
    }
  }
}

const PyValue* DictGetInt(const PyValue* dict, int64_t key) {
  if (dict == nullptr || dict->kind != PyKind::kDict) return nullptr;
  for (size_t i = 0; i + 1 < dict->items.size(); i += 2) {
    if (dict->items[i]->kind == PyKind::kInt && dict->items[i]->integer == key) {
      return dict->items[i + 1];
    }
  }
  return nullptr;
}

// An int, a float holding an integer, or a one-element tensor (torch's Adam keeps `step` as one).
absl::StatusOr<int64_t> ScalarInt(const TorchArchive& archive, const PyValue* v,
                                  std::string_view what) {
  if (v == nullptr) return absl::NotFoundError(Cat(archive.source(), ": no ", what));
  if (v->kind == PyKind::kInt) return v->integer;
  if (v->kind == PyKind::kFloat && v->real == static_cast<double>(static_cast<int64_t>(v->real))) {
    return static_cast<int64_t>(v->real);
  }
  if (TorchArchive::IsTensor(v)) {
    auto t = archive.Tensor(v, what);
    if (!t.ok()) return t.status();
    // The value is read through the mapping: drop the pages that brings in (a whole large folio
    // of the file around a 4-byte record, for each parameter's `step`) once it is read.
    absl::Cleanup drop = [&] { archive.Release(t->data); };
    if (t->data.size() == DTypeSize(t->dtype) && t->dtype != DType::kBool) {
      auto value = ElementAsDouble(t->dtype, t->data.data(), 0);
      if (!value && (t->dtype == DType::kI64 || t->dtype == DType::kI32)) {
        int64_t i = 0;
        if (t->dtype == DType::kI64) {
          std::memcpy(&i, t->data.data(), 8);
        } else {
          int32_t j = 0;
          std::memcpy(&j, t->data.data(), 4);
          i = j;
        }
        return i;
      }
      if (value && *value == static_cast<double>(static_cast<int64_t>(*value))) {
        return static_cast<int64_t>(*value);
      }
    }
  }
  return absl::DataLossError(
      Cat(archive.source(), ": ", what, " is ", PyRepr(v, 60), ", not an integer"));
}

class MegatronTorchReader : public TpShardSource {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointSource>> Open(const std::string& iteration_dir,
                                                                CheckpointReadOptions options);
  std::string_view format_name() const override { return "megatron torch"; }
  void DescribeFiles(std::ostream& out) const override {
    for (const auto& archive : archives_) {
      const stdfs::path path(archive->source());
      std::error_code error;
      out << absl::StrFormat("  %-40s %12d bytes %5d records\n",
                             (path.parent_path().filename() / path.filename()).string(),
                             stdfs::file_size(path, error), archive->zip().entries().size());
    }
  }

 private:
  MegatronTorchReader(CheckpointMetadata metadata, ModelLayout layout, MegatronRun run)
      : TpShardSource(std::move(metadata), std::move(layout)), run_(std::move(run)) {}
  absl::Status AddModel(const TorchArchive& archive, int tp, int pp);
  absl::Status AddDistributedOptimizer(const TorchArchive& archive, int tp, int pp);
  absl::Status AddOptimizer(const TorchArchive& archive, int tp, int pp, int64_t* step);
  absl::Status AddRankTensor(const TorchArchive& archive, TensorKind kind, const ParamSpec& spec,
                             int tp, const PyValue* value, std::string_view what);

  MegatronRun run_;
  std::vector<std::unique_ptr<TorchArchive>> archives_;
};

absl::Status MegatronTorchReader::AddRankTensor(const TorchArchive& archive, TensorKind kind,
                                                const ParamSpec& spec, int tp, const PyValue* value,
                                                std::string_view what) {
  auto tensor = archive.Tensor(value, what);
  if (!tensor.ok()) return tensor.status();
  const std::vector<int64_t> shape = layout_.ShardShape(spec);
  const DType dtype = kind == TensorKind::kParam ? metadata_.config.params_dtype : DType::kF32;
  if (tensor->shape != shape) {
    return absl::DataLossError(Cat(archive.source(), ": ", what, " has shape [",
                                   absl::StrJoin(tensor->shape, ","), "], the layout expects [",
                                   absl::StrJoin(shape, ","), "] for '", spec.name, "'"));
  }
  if (tensor->dtype != dtype) {
    return absl::DataLossError(Cat(archive.source(), ": ", what, " is ", DTypeName(tensor->dtype),
                                   ", expected ", DTypeName(dtype)));
  }
  AddShard(kind, spec.name, tp, {tensor->data, &archive, tensor->storage_key});
  return absl::OkStatus();
}

absl::Status MegatronTorchReader::AddModel(const TorchArchive& archive, int tp, int pp) {
  const PyValue* root = archive.root();
  const int vpp = metadata_.parallel.vpp;
  absl::flat_hash_set<std::string> seen;
  for (int v = 0; v < vpp; ++v) {
    const std::string key = vpp > 1 ? Cat("model", v) : "model";
    const PyValue* model = DictGet(root, key);
    if (model == nullptr || model->kind != PyKind::kDict) {
      return absl::DataLossError(Cat(archive.source(), ": no '", key, "' state dict"));
    }
    std::vector<std::pair<std::string, const PyValue*>> entries;
    Flatten(model, "", 0, &entries);
    for (const auto& [name, value] : entries) {
      const std::optional<std::string> canonical = CanonicalFromLegacyName(layout_, pp, v, name);
      if (!canonical) continue;  // _extra_state
      const ParamSpec* spec = canonical->empty() ? nullptr : layout_.Find(*canonical);
      if (spec == nullptr || spec->stage != pp || spec->virtual_chunk != v) {
        return absl::DataLossError(Cat(archive.source(), ": unexpected tensor '", name, "' in '",
                                       key, "' (not part of this model's stage ", pp,
                                       vpp > 1 ? Cat(" chunk ", v) : "", ")"));
      }
      if (!seen.insert(spec->name).second) {
        return absl::DataLossError(Cat(archive.source(), ": '", spec->name, "' appears twice"));
      }
      // A tied copy is checked but read from the parameter it copies.
      if (!spec->tied_to.empty()) {
        auto tensor = archive.Tensor(value, name);
        if (!tensor.ok()) return tensor.status();
        continue;
      }
      if (auto s = AddRankTensor(archive, TensorKind::kParam, *spec, tp, value, name); !s.ok()) {
        return s;
      }
      if (run_.fp32_training && metadata_.has_optimizer && !run_.distributed_optimizer) {
        auto tensor = archive.Tensor(value, name);
        AddShard(TensorKind::kMainParam, spec->name, tp,
                 {tensor->data, &archive, tensor->storage_key});
      }
    }
  }
  for (const ParamSpec* spec : layout_.StageParams(pp)) {
    if (!seen.contains(spec->name)) {
      return absl::DataLossError(Cat(archive.source(), ": tensor '", LegacyNameOf(layout_, *spec),
                                     "' (", spec->name, ") is missing"));
    }
  }
  return absl::OkStatus();
}

absl::Status MegatronTorchReader::AddDistributedOptimizer(const TorchArchive& archive, int tp,
                                                          int pp) {
  const PyValue* root = archive.root();
  const PyValue* coalesced = DictGet(root, "buckets_coalesced");
  if (root->kind != PyKind::kDict || coalesced == nullptr || coalesced->kind != PyKind::kBool ||
      !coalesced->boolean) {
    return absl::InvalidArgumentError(
        Cat(archive.source(),
            ": distributed-optimizer state in an older (per-bucket) format; "
            "resave it with a current Megatron-LM"));
  }
  for (int v = 0; v < metadata_.parallel.vpp; ++v) {
    const PyValue* buffer = DictGetInt(root, v);
    if (buffer == nullptr || buffer->kind != PyKind::kDict || buffer->items.size() != 2) {
      return absl::DataLossError(Cat(archive.source(), ": no single-dtype buffer ", v,
                                     " (only one parameter dtype per model chunk is supported)"));
    }
    const PyValue* state = buffer->items[1];
    const std::optional<int64_t> bucket_size =
        v > 0 || pp > 0 || run_.overlap_param_gather_with_optimizer_step ? std::nullopt
                                                                         : run_.bucket_size;
    const BufferLayout flat =
        MegatronBufferLayout(layout_, pp, v, bucket_size, run_.data_parallel_size);
    auto numel = ScalarInt(archive, DictGet(state, "numel_unpadded"), "numel_unpadded");
    if (!numel.ok()) return numel.status();
    if (*numel != flat.numel_unpadded) {
      return absl::DataLossError(
          Cat(archive.source(), ": buffer ", v, " holds ", *numel, " elements, but the model's ",
              flat.params.size(), " parameters with ",
              bucket_size ? Cat("DDP buckets of ", *bucket_size) : std::string("one DDP bucket"),
              " lay out ", flat.numel_unpadded,
              " (the run's --ddp-bucket-size or "
              "--overlap-grad-reduce differ from its saved arguments?)"));
    }
    for (auto [kind, key] : {std::pair{TensorKind::kMainParam, "param"},
                             {TensorKind::kExpAvg, "exp_avg"},
                             {TensorKind::kExpAvgSq, "exp_avg_sq"}}) {
      auto tensor = archive.Tensor(DictGet(state, key), Cat("buffer ", v, " ", key));
      if (!tensor.ok()) return tensor.status();
      if (tensor->dtype != DType::kF32 || tensor->shape != std::vector<int64_t>{*numel}) {
        return absl::DataLossError(Cat(archive.source(), ": buffer ", v, " '", key, "' is not ",
                                       *numel, " float32 values"));
      }
      for (const BufferParam& param : flat.params) {
        if (!param.spec->tied_to.empty()) continue;
        AddShard(kind, param.spec->name, tp,
                 {tensor->data.subspan(param.world_offset * 4, param.numel * 4), &archive,
                  tensor->storage_key});
      }
    }
  }
  return absl::OkStatus();
}

absl::Status MegatronTorchReader::AddOptimizer(const TorchArchive& archive, int tp, int pp,
                                               int64_t* step) {
  const PyValue* optimizer = DictGet(archive.root(), "optimizer");
  if (optimizer != nullptr && optimizer->kind == PyKind::kList) {
    return absl::InvalidArgumentError(
        Cat(archive.source(), ": state of several chained optimizers is not supported"));
  }
  // Mixed precision: {"optimizer": torch state, "fp32_from_fp16_params": [[main per group]]};
  // fp32: the torch state itself.
  const PyValue* mains = DictGet(optimizer, "fp32_from_fp16_params");
  const PyValue* inner = mains != nullptr ? DictGet(optimizer, "optimizer") : optimizer;
  const PyValue* groups = DictGet(inner, "param_groups");
  const PyValue* state = DictGet(inner, "state");
  if (groups == nullptr || groups->kind != PyKind::kList || state == nullptr ||
      state->kind != PyKind::kDict || (mains == nullptr && !run_.fp32_training)) {
    return absl::DataLossError(Cat(archive.source(), ": 'optimizer' is not Adam's state"));
  }
  // Megatron's groups: weight decay on and off, each in named_parameters() order over the chunks.
  std::vector<const ParamSpec*> decay, no_decay;
  for (int v = 0; v < metadata_.parallel.vpp; ++v) {
    for (const ParamSpec* spec : MegatronParamOrder(layout_, pp, v)) {
      (MegatronNoWeightDecay(*spec) ? no_decay : decay).push_back(spec);
    }
  }
  std::optional<int64_t> common_step;
  bool matched_decay = false, matched_no_decay = false;
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const PyValue* group = groups->items[g];
    const PyValue* params = DictGet(group, "params");
    const PyValue* wd_mult = DictGet(group, "wd_mult");
    const PyValue* lr_mult = DictGet(group, "lr_mult");
    if (params == nullptr || params->kind != PyKind::kList) {
      return absl::DataLossError(Cat(archive.source(), ": param group ", g, " has no params"));
    }
    if (lr_mult != nullptr && !(lr_mult->kind == PyKind::kFloat && lr_mult->real == 1.0) &&
        !(lr_mult->kind == PyKind::kInt && lr_mult->integer == 1)) {
      return absl::InvalidArgumentError(Cat(archive.source(), ": param group ", g, " has lr_mult ",
                                            PyRepr(lr_mult, 20),
                                            "; per-group learning rates are not supported"));
    }
    const bool no_wd =
        wd_mult != nullptr && ((wd_mult->kind == PyKind::kFloat && wd_mult->real == 0) ||
                               (wd_mult->kind == PyKind::kInt && wd_mult->integer == 0));
    const std::vector<const ParamSpec*>& ours = no_wd ? no_decay : decay;
    (no_wd ? matched_no_decay : matched_decay) = true;
    if (params->items.size() != ours.size()) {
      return absl::DataLossError(Cat(archive.source(), ": param group ", g, " (wd_mult ",
                                     no_wd ? "0" : "1", ") holds ", params->items.size(),
                                     " parameters; the model's stage has ", ours.size()));
    }
    const PyValue* group_mains =
        mains != nullptr && mains->kind == PyKind::kList && g < mains->items.size()
            ? mains->items[g]
            : nullptr;
    if (mains != nullptr && (group_mains == nullptr || group_mains->kind != PyKind::kList ||
                             group_mains->items.size() != ours.size())) {
      return absl::DataLossError(
          Cat(archive.source(), ": fp32_from_fp16_params does not match param group ", g));
    }
    if (const PyValue* s = DictGet(group, "step")) {
      auto v = ScalarInt(archive, s, "param group step");
      if (!v.ok()) return v.status();
      common_step = *v;
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      const ParamSpec& spec = *ours[i];
      const PyValue* index = params->items[i];
      const PyValue* entry =
          index->kind == PyKind::kInt ? DictGetInt(state, index->integer) : nullptr;
      if (entry == nullptr) {
        return absl::DataLossError(Cat(archive.source(), ": no Adam state for '", spec.name, "'"));
      }
      if (const PyValue* s = DictGet(entry, "step")) {
        auto v = ScalarInt(archive, s, Cat("step of '", spec.name, "'"));
        if (!v.ok()) return v.status();
        if (common_step && *common_step != *v) {
          return absl::DataLossError(
              Cat(archive.source(), ": Adam steps differ (", *common_step, " and ", *v, ")"));
        }
        common_step = *v;
      }
      if (!spec.tied_to.empty()) continue;
      for (auto [kind, key] :
           {std::pair{TensorKind::kExpAvg, "exp_avg"}, {TensorKind::kExpAvgSq, "exp_avg_sq"}}) {
        if (auto s = AddRankTensor(archive, kind, spec, tp, DictGet(entry, key),
                                   Cat(key, " of '", spec.name, "'"));
            !s.ok()) {
          return s;
        }
      }
      if (group_mains != nullptr) {
        if (auto s = AddRankTensor(archive, TensorKind::kMainParam, spec, tp, group_mains->items[i],
                                   Cat("fp32 main param of '", spec.name, "'"));
            !s.ok()) {
          return s;
        }
      }
    }
  }
  if ((!decay.empty() && !matched_decay) || (!no_decay.empty() && !matched_no_decay)) {
    return absl::DataLossError(
        Cat(archive.source(), ": the optimizer's param groups do not cover the model"));
  }
  if (common_step) *step = *common_step;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointSource>> MegatronTorchReader::Open(
    const std::string& iteration_dir, CheckpointReadOptions options) {
  int tp_size = 0, pp_size = 0;
  auto ranks = ListRankDirs(iteration_dir, &tp_size, &pp_size);
  if (!ranks.ok()) return ranks.status();
  auto first = TorchArchive::Open((stdfs::path(ranks->front().path) / kModelFile).string());
  if (!first.ok()) return first.status();
  const PyValue* root = (*first)->root();
  const std::string& source = (*first)->source();
  if (root->kind != PyKind::kDict) {
    return absl::DataLossError(
        Cat(source, ": holds ", PyRepr(root, 80), ", not a Megatron state dict"));
  }
  const PyValue* version = DictGet(root, "checkpoint_version");
  const double checkpoint_version = version == nullptr                ? 0
                                    : version->kind == PyKind::kFloat ? version->real
                                    : version->kind == PyKind::kInt   ? version->integer
                                                                      : 0;
  if (checkpoint_version < 2.0) {
    return absl::InvalidArgumentError(
        Cat(source, ": checkpoint_version ", checkpoint_version,
            " stores QKV in an older order; only version 2.0 and later are read"));
  }
  auto run = MegatronRunFromArgs(DictGet(root, "args"), source);
  if (!run.ok()) return run.status();
  if (run->parallel.tp != tp_size || run->parallel.pp != pp_size) {
    return absl::DataLossError(Cat(iteration_dir, ": its arguments say TP ", run->parallel.tp,
                                   " x PP ", run->parallel.pp, " but it holds TP ", tp_size,
                                   " x PP ", pp_size, " rank directories"));
  }
  auto layout = ModelLayout::Create(run->config, run->parallel);
  if (!layout.ok()) return absl::DataLossError(Cat(source, ": ", layout.status().message()));
  CheckpointMetadata metadata;
  metadata.config = run->config;
  metadata.parallel = run->parallel;
  const PyValue* iteration = DictGet(root, "iteration");
  metadata.iteration = iteration != nullptr && iteration->kind == PyKind::kInt ? iteration->integer
                       : stdfs::path(iteration_dir).filename() == "release"    ? -1
                                                                               : 0;
  metadata.consumed_samples = run->consumed_samples;
  metadata.args_json = run->args_json;
  // Optimizer state is there when the first rank has it (the others must then have it too).
  const bool dist_file = stdfs::exists(stdfs::path(ranks->front().path) / kDistOptimFile);
  metadata.has_optimizer =
      run->distributed_optimizer ? dist_file : DictGet(root, "optimizer") != nullptr;
  std::unique_ptr<MegatronTorchReader> reader(
      new MegatronTorchReader(std::move(metadata), *std::move(layout), *std::move(run)));
  reader->iteration_dir_ = iteration_dir;
  reader->verify_storages_ = options.verify;
  int64_t step = -1;
  for (size_t i = 0; i < ranks->size(); ++i) {
    const RankDir& rank = (*ranks)[i];
    std::unique_ptr<TorchArchive> archive;
    if (i == 0) {
      archive = *std::move(first);
    } else {
      auto opened = TorchArchive::Open((stdfs::path(rank.path) / kModelFile).string());
      if (!opened.ok()) return opened.status();
      archive = *std::move(opened);
      // Every rank saved the same run.
      auto rank_run = MegatronRunFromArgs(DictGet(archive->root(), "args"), archive->source());
      if (!rank_run.ok()) return rank_run.status();
      const ParallelConfig& a = rank_run->parallel;
      const ParallelConfig& b = reader->run_.parallel;
      if (ModelConfigToJson(rank_run->config) != ModelConfigToJson(reader->run_.config) ||
          a.tp != b.tp || a.pp != b.pp || a.vpp != b.vpp ||
          a.first_stage_layers != b.first_stage_layers ||
          a.last_stage_layers != b.last_stage_layers) {
        return absl::DataLossError(Cat(archive->source(),
                                       ": its args describe another model or "
                                       "layout than ",
                                       source, "'s"));
      }
    }
    // The pickle and small records now; each storage record as a tensor is first copied out of
    // it (TpShardSource::StreamFull), so the data is read once, not once more up front.
    if (options.verify) {
      if (auto s = archive->VerifyCrcs(/*storages=*/false); !s.ok()) return s;
    }
    if (auto s = reader->AddModel(*archive, rank.tp, rank.pp); !s.ok()) return s;
    if (reader->metadata_.has_optimizer) {
      if (reader->run_.distributed_optimizer) {
        const std::string path = (stdfs::path(rank.path) / kDistOptimFile).string();
        if (!stdfs::exists(path)) {
          return absl::DataLossError(Cat(path, ": missing (checkpoint is incomplete)"));
        }
        auto optim = TorchArchive::Open(path);
        if (!optim.ok()) return optim.status();
        if (options.verify) {
          if (auto s = (*optim)->VerifyCrcs(/*storages=*/false); !s.ok()) return s;
        }
        if (auto s = reader->AddDistributedOptimizer(**optim, rank.tp, rank.pp); !s.ok()) return s;
        (*optim)->ReleaseAll();
        (*optim)->DropPickle();
        reader->archives_.push_back(*std::move(optim));
        // The step is in the model file's optimizer entry (its param groups).
        const PyValue* groups =
            DictGet(DictGet(DictGet(archive->root(), "optimizer"), "optimizer"), "param_groups");
        if (groups != nullptr && groups->kind == PyKind::kList && !groups->items.empty()) {
          auto s = ScalarInt(*archive, DictGet(groups->items[0], "step"), "param group step");
          if (s.ok()) step = *s;
        }
      } else if (auto s = reader->AddOptimizer(*archive, rank.tp, rank.pp, &step); !s.ok()) {
        return s;
      }
    }
    // Whatever else the metadata touched through the mapping leaves the resident set; the
    // tensors' pages come and go as TpShardSource streams them. The pickle is done with too.
    archive->ReleaseAll();
    archive->DropPickle();
    reader->archives_.push_back(std::move(archive));
  }
  if (auto missing = reader->FirstMissing(TensorKind::kParam)) {
    return absl::DataLossError(
        Cat(iteration_dir, ": no tensor '", missing->first, "' on TP rank ", missing->second));
  }
  if (reader->metadata_.has_optimizer) {
    for (TensorKind kind : kOptimizerKinds) {
      if (auto missing = reader->FirstMissing(kind)) {
        return absl::DataLossError(Cat(iteration_dir, ": no optimizer state for '", missing->first,
                                       "' on TP rank ", missing->second));
      }
    }
    // An Adam step of 0 (none recorded) would re-run the bias correction from scratch.
    reader->metadata_.optimizer_step =
        step >= 0 ? step : std::max<int64_t>(0, reader->metadata_.iteration);
  }
  return std::unique_ptr<CheckpointSource>(std::move(reader));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenMegatronTorchCheckpoint(
    const std::string& iteration_dir, CheckpointReadOptions options) {
  return MegatronTorchReader::Open(iteration_dir, options);
}

std::string DetectIterationFormat(const std::string& iteration_dir) {
  std::error_code error;
  if (stdfs::exists(stdfs::path(iteration_dir) / ".metadata", error)) return "torch_dist";
  if (stdfs::exists(stdfs::path(iteration_dir) / kMetadataFileName, error)) {
    // Ours (a torch_dist iteration has .metadata beside its metadata.json).
    return "leantron";
  }
  for (const auto& entry : stdfs::directory_iterator(iteration_dir, error)) {
    bool expert = false;
    if (ParseRankDir(entry.path().filename().string(), &expert) &&
        stdfs::exists(entry.path() / kModelFile, error)) {
      return "torch";
    }
  }
  return "";
}

}  // namespace leantron::ckpt
