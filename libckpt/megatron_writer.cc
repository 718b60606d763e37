#include "libckpt/megatron_writer.h"

#include <filesystem>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "libckpt/checkpoint_writer.h"
#include "libckpt/megatron_args_writer.h"
#include "libckpt/megatron_layout.h"
#include "libckpt/megatron_reader.h"
#include "libckpt/pickle_writer.h"
#include "libckpt/strings.h"
#include "libckpt/torch_archive.h"
#include "libckpt/zip_writer.h"
#include "libfs/atomic_file.h"
#include "simdjson.h"

namespace leantron::ckpt {
namespace {

namespace stdfs = std::filesystem;

struct Stored {
  std::string key;  // data/<key>
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// One mp_rank directory being written.
struct RankOut {
  int tp = 0, pp = 0;
  std::unique_ptr<TorchZipWriter> model;
  std::unique_ptr<TorchZipWriter> optim;  // distrib_optim.pt
  int next_key = 0, next_optim_key = 0;
  // [kind][name]
  absl::flat_hash_map<std::string, Stored> stored[4];
  std::vector<int64_t> steps;  // Non-distributed optimizer: a step tensor key per parameter.
  // Distributed optimizer, per model chunk: the buffer and its three records.
  std::vector<BufferLayout> buffers;
  std::vector<std::array<size_t, 3>> buffer_records;
  std::vector<std::array<std::string, 3>> buffer_keys;
  absl::flat_hash_map<std::string, std::pair<int, const BufferParam*>> in_buffer;

  absl::StatusOr<Stored> Add(DType dtype, const std::vector<int64_t>& shape,
                             std::span<const std::byte> data) {
    Stored s{std::to_string(next_key++), dtype, shape};
    if (auto status = model->Add(Cat("data/", s.key), data); !status.ok()) return status;
    return s;
  }
};

bool IsLinearModule(std::string_view module) {
  for (std::string_view suffix : {"self_attention.linear_proj", "self_attention.linear_qkv",
                                  "mlp.linear_fc1", "mlp.linear_fc2"}) {
    if (absl::EndsWith(ToAbsl(module), ToAbsl(suffix))) return true;
  }
  return module == "output_layer";
}

std::string Module(std::string_view name) { return std::string(name.substr(0, name.rfind('.'))); }

void EmitTensor(PickleWriter& p, const Stored& s) {
  p.Tensor(TorchStorageClass(s.dtype), s.key, NumElements(s.shape), s.shape);
}

// The model state dict of chunk (pp, v): Megatron's state_dict() order, a linear module's
// `_extra_state` (None for the local implementation) after its parameters.
void EmitModel(PickleWriter& p, const ModelLayout& layout, const RankOut& r, int v) {
  p.OrderedDict();
  p.Mark();
  const std::vector<const ParamSpec*> order = MegatronParamOrder(layout, r.pp, v);
  bool output_layer = false;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string name = LegacyNameOf(layout, *order[k]);
    p.Str(name);
    EmitTensor(p, r.stored[0].at(order[k]->name));
    const std::string module = Module(name);
    output_layer = output_layer || module == "output_layer";
    if (IsLinearModule(module) &&
        (k + 1 == order.size() || Module(LegacyNameOf(layout, *order[k + 1])) != module)) {
      p.Str(module + "._extra_state");
      p.None();
    }
  }
  const ParallelConfig& par = layout.parallel();
  if (r.pp == par.pp - 1 && v == par.vpp - 1 && !output_layer) {
    p.Str("output_layer._extra_state");
    p.None();
  }
  p.SetItems();
}

std::string SerializationId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 40; ++i) id.push_back(static_cast<char>('0' + rd() % 10));
  return id;
}

absl::Status FinishArchive(TorchZipWriter& zip, std::string pickle) {
  for (auto [name, text] : {std::pair<std::string_view, std::string_view>{"data.pkl", pickle},
                            {".format_version", "1"},
                            {".storage_alignment", "64"},
                            {"byteorder", "little"},
                            {"version", "3\n"}}) {
    if (auto s = zip.Add(name, text); !s.ok()) return s;
  }
  if (auto s = zip.Add(".data/serialization_id", SerializationId()); !s.ok()) return s;
  return zip.Commit();
}

}  // namespace

bool UsesDistributedOptimizer(const std::string& args_json) {
  simdjson::dom::parser parser;
  simdjson::dom::object args;
  bool value = false;
  return parser.parse(args_json).get(args) == simdjson::SUCCESS &&
         args["use_distributed_optimizer"].get(value) == simdjson::SUCCESS && value;
}

absl::Status SaveMegatronCheckpoint(FullTensorSource& source, const CheckpointMetadata& metadata,
                                    const std::string& checkpoint_dir,
                                    const MegatronSaveOptions& options) {
  auto layout_or = ModelLayout::Create(metadata.config, metadata.parallel);
  if (!layout_or.ok()) return layout_or.status();
  const ModelLayout& layout = *layout_or;
  const ModelConfig& c = metadata.config;
  const ParallelConfig& par = metadata.parallel;
  const bool optimizer = metadata.has_optimizer;
  const bool dist = optimizer && options.distributed_optimizer;
  if (optimizer && !source.has_optimizer()) {
    return absl::FailedPreconditionError("cannot save optimizer state: the source has none");
  }
  if (const RopeScaling& r = c.rope_scaling, fixed;
      r.llama3 &&
      (r.low_freq_factor != fixed.low_freq_factor || r.high_freq_factor != fixed.high_freq_factor ||
       r.original_max_position_embeddings != fixed.original_max_position_embeddings)) {
    return absl::InvalidArgumentError(
        Cat("the model's llama3 rope scaling (low_freq_factor ", r.low_freq_factor,
            ", high_freq_factor ", r.high_freq_factor, ", original_max_position_embeddings ",
            r.original_max_position_embeddings,
            ") is not Megatron's --use-rope-scaling, which fixes them at 1, 4 and 8192"));
  }
  if (c.params_dtype != DType::kBF16 && c.params_dtype != DType::kF32 &&
      c.params_dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        Cat("Megatron checkpoints hold BF16, F16 or F32 weights, not ", DTypeName(c.params_dtype)));
  }
  if (optimizer && c.params_dtype == DType::kF16) {
    return absl::InvalidArgumentError(
        "an fp16 run's optimizer state needs its loss scaler's state, which the source does not "
        "have; save without optimizer state (Megatron's --no-load-optim) or in bf16");
  }
  std::error_code error;
  stdfs::create_directories(checkpoint_dir, error);
  if (error) return absl::InternalError(Cat(checkpoint_dir, ": cannot create: ", error.message()));
  auto temp = PrepareCheckpointSave(checkpoint_dir, metadata.iteration);
  if (!temp.ok()) return temp.status();
  const MegatronArgs args(metadata.args_json);

  std::vector<RankOut> ranks(static_cast<size_t>(par.tp) * par.pp);
  for (int pp = 0; pp < par.pp; ++pp) {
    for (int tp = 0; tp < par.tp; ++tp) {
      RankOut& r = ranks[pp * par.tp + tp];
      r.tp = tp;
      r.pp = pp;
      const stdfs::path dir = stdfs::path(*temp) / layout.ShardDirName(tp, pp);
      stdfs::create_directories(dir, error);
      if (error)
        return absl::InternalError(Cat(dir.string(), ": cannot create: ", error.message()));
      auto model = TorchZipWriter::Create((dir / "model_optim_rng.pt").string(), "model_optim_rng");
      if (!model.ok()) return model.status();
      r.model = *std::move(model);
      if (!dist) continue;
      auto optim = TorchZipWriter::Create((dir / "distrib_optim.pt").string(), "distrib_optim");
      if (!optim.ok()) return optim.status();
      r.optim = *std::move(optim);
      for (int v = 0; v < par.vpp; ++v) {
        r.buffers.push_back(MegatronBufferLayout(layout, pp, v, std::nullopt, 1));
        std::array<size_t, 3> records;
        std::array<std::string, 3> keys;
        for (int k = 0; k < 3; ++k) {
          keys[k] = std::to_string(r.next_optim_key++);
          auto record = r.optim->Reserve(
              Cat("data/", keys[k]), static_cast<uint64_t>(r.buffers.back().numel_unpadded) * 4);
          if (!record.ok()) return record.status();
          records[k] = *record;
        }
        r.buffer_records.push_back(records);
        r.buffer_keys.push_back(keys);
      }
      for (int v = 0; v < par.vpp; ++v) {
        for (const BufferParam& param : r.buffers[v].params) {
          r.in_buffer[param.spec->name] = {v, &param};
        }
      }
    }
  }

  std::vector<TensorKind> kinds = {TensorKind::kParam};
  if (optimizer) kinds.insert(kinds.end(), std::begin(kOptimizerKinds), std::end(kOptimizerKinds));
  int64_t total_tensors = 0, total_bytes = 0;
  for (const ParamSpec& spec : layout.params()) {
    if (!spec.tied_to.empty()) continue;
    for (TensorKind kind : kinds) {
      ++total_tensors;
      total_bytes += NumElements(spec.shape) *
                     static_cast<int64_t>(
                         DTypeSize(kind == TensorKind::kParam ? c.params_dtype : DType::kF32));
    }
  }
  ConversionProgress progress(options.progress, total_tensors, total_bytes);
  Tensor full;
  std::vector<std::byte> shard_buffer;
  for (const ParamSpec& spec : layout.params()) {
    if (!spec.tied_to.empty()) continue;
    std::vector<const ParamSpec*> targets = {&spec};
    for (const ParamSpec& copy : layout.params()) {
      if (copy.tied_to == spec.name) targets.push_back(&copy);
    }
    for (TensorKind kind : kinds) {
      // An fp32 run's Adam steps the weights themselves: the main weights (the truth) are written
      // as the weights, and not again.
      const bool fp32_adam = optimizer && !dist && c.params_dtype == DType::kF32;
      if (fp32_adam && kind == TensorKind::kMainParam) continue;
      const TensorKind read =
          fp32_adam && kind == TensorKind::kParam ? TensorKind::kMainParam : kind;
      if (auto s = source.ReadFull(spec, read, &full); !s.ok()) return s;
      const DType dtype = kind == TensorKind::kParam ? c.params_dtype : DType::kF32;
      if (full.dtype != dtype) {
        return absl::InvalidArgumentError(Cat("'", spec.name, "' is ", DTypeName(full.dtype),
                                              " but the checkpoint stores ", DTypeName(dtype)));
      }
      const size_t element = DTypeSize(dtype);
      for (const ParamSpec* target : targets) {
        const std::vector<int64_t> shape = layout.ShardShape(*target);
        for (int tp = 0; tp < par.tp; ++tp) {
          std::span<const std::byte> shard;
          if (auto direct = layout.ContiguousShard(*target, tp, element, full.bytes())) {
            shard = *direct;
          } else {
            shard_buffer.resize(full.data.size() / par.tp);
            layout.ExtractShard(*target, tp, element, full.bytes(), shard_buffer);
            shard = shard_buffer;
          }
          RankOut& r = ranks[target->stage * par.tp + tp];
          if (kind == TensorKind::kParam) {
            auto stored = r.Add(dtype, shape, shard);
            if (!stored.ok()) return stored.status();
            r.stored[0][target->name] = *stored;
          } else if (dist) {
            const auto& [v, param] = r.in_buffer.at(target->name);
            const int k = kind == TensorKind::kMainParam ? 0 : kind == TensorKind::kExpAvg ? 1 : 2;
            if (auto s = r.optim->Write(r.buffer_records[v][k], param->world_offset * 4, shard);
                !s.ok()) {
              return s;
            }
          } else {
            auto stored = r.Add(dtype, shape, shard);
            if (!stored.ok()) return stored.status();
            r.stored[static_cast<int>(kind)][target->name] = *stored;
          }
        }
      }
      progress.Add(1, static_cast<int64_t>(full.data.size()));
    }
  }

  const int64_t step = metadata.optimizer_step;
  for (RankOut& r : ranks) {
    // Non-distributed optimizer: Megatron's groups, a step tensor per parameter.
    std::vector<std::vector<const ParamSpec*>> groups(2);
    if (optimizer && !dist) {
      for (int v = 0; v < par.vpp; ++v) {
        for (const ParamSpec* spec : MegatronParamOrder(layout, r.pp, v)) {
          groups[MegatronNoWeightDecay(*spec) ? 1 : 0].push_back(spec);
        }
      }
      for (size_t i = 0; i < groups[0].size() + groups[1].size(); ++i) {
        const float value = static_cast<float>(step);
        auto stored = r.Add(DType::kF32, {}, std::as_bytes(std::span<const float>(&value, 1)));
        if (!stored.ok()) return stored.status();
        r.steps.push_back(std::stoll(stored->key));
      }
    }
    PickleWriter p;
    p.EmptyDict();
    p.Mark();
    p.Str("args");
    EmitMegatronArgs(p, args, metadata, layout, dist);
    p.Str("checkpoint_version");
    p.Float(3.0);
    p.Str("iteration");
    p.Int(std::max<int64_t>(metadata.iteration, 0));
    for (int v = 0; v < par.vpp; ++v) {
      p.Str(par.vpp > 1 ? Cat("model", v) : "model");
      EmitModel(p, layout, r, v);
    }
    if (optimizer) {
      p.Str("optimizer");
      if (dist) {
        p.EmptyDict();
        p.Mark();
        p.Str("optimizer");
        p.EmptyDict();
        p.Mark();
        p.Str("param_groups");
        EmitMegatronParamGroups(p, args, step, nullptr);
        p.SetItems();
        p.SetItems();
      } else {
        std::vector<std::vector<int64_t>> indices(2);
        int64_t index = 0;
        for (int g = 0; g < 2; ++g) {
          for (size_t i = 0; i < groups[g].size(); ++i) indices[g].push_back(index++);
        }
        const bool mixed = c.params_dtype != DType::kF32;
        if (mixed) {
          p.EmptyDict();
          p.Mark();
          p.Str("optimizer");
        }
        p.EmptyDict();
        p.Mark();
        p.Str("state");
        p.EmptyDict();
        p.Mark();
        index = 0;
        for (int g = 0; g < 2; ++g) {
          for (const ParamSpec* spec : groups[g]) {
            const std::string& name = spec->name;
            p.Int(index);
            p.EmptyDict();
            p.Mark();
            p.Str("step");
            p.Tensor("FloatStorage", std::to_string(r.steps[index]), 1, {});
            p.Str("exp_avg");
            EmitTensor(p, r.stored[static_cast<int>(TensorKind::kExpAvg)].at(name));
            p.Str("exp_avg_sq");
            EmitTensor(p, r.stored[static_cast<int>(TensorKind::kExpAvgSq)].at(name));
            p.SetItems();
            ++index;
          }
        }
        p.SetItems();
        p.Str("param_groups");
        EmitMegatronParamGroups(p, args, step, &indices);
        p.SetItems();
        if (mixed) {
          p.Str("fp32_from_fp16_params");
          p.EmptyList();
          p.Mark();
          for (int g = 0; g < 2; ++g) {
            p.EmptyList();
            p.Mark();
            for (const ParamSpec* spec : groups[g]) {
              EmitTensor(p, r.stored[static_cast<int>(TensorKind::kMainParam)].at(spec->name));
            }
            p.Appends();
          }
          p.Appends();
          p.SetItems();
        }
      }
      if (args.Number("lr")) {
        p.Str("opt_param_scheduler");
        EmitMegatronScheduler(p, args, metadata);
      }
    }
    p.Str("num_floating_point_operations_so_far");
    p.Int(0);
    p.SetItems();
    if (auto s = FinishArchive(*r.model, p.Finish()); !s.ok()) return s;
    if (dist) {
      PickleWriter q;
      q.EmptyDict();
      q.Mark();
      q.Str("buckets_coalesced");
      q.Bool(true);
      for (int v = 0; v < par.vpp; ++v) {
        q.Int(v);
        q.EmptyDict();
        q.Mark();
        q.Mark();
        q.Global("torch", TorchDtypeName(c.params_dtype));
        q.Global("torch", "float32");
        q.Tuple();
        q.EmptyDict();
        q.Mark();
        const int64_t numel = r.buffers[v].numel_unpadded;
        for (int k = 0; k < 3; ++k) {
          q.Str(k == 0 ? "param" : k == 1 ? "exp_avg" : "exp_avg_sq");
          q.Tensor("FloatStorage", r.buffer_keys[v][k], numel, {numel});
        }
        q.Str("numel_unpadded");
        q.Int(numel);
        q.SetItems();
        q.SetItems();
      }
      q.SetItems();
      if (auto s = FinishArchive(*r.optim, q.Finish()); !s.ok()) return s;
    }
    if (auto s = fs::FsyncPath((stdfs::path(*temp) / layout.ShardDirName(r.tp, r.pp)).string());
        !s.ok()) {
      return s;
    }
  }
  progress.Done();
  if (auto s = fs::FsyncPath(*temp); !s.ok()) return s;
  // Read back what was written: names, shapes, dtypes, buffer layout.
  if (auto reread = OpenMegatronTorchCheckpoint(*temp, {.verify = false}); !reread.ok()) {
    return absl::InternalError(Cat("the Megatron checkpoint just written does not read back: ",
                                   reread.status().message()));
  }
  return PublishIteration(checkpoint_dir, *temp, metadata.iteration);
}

}  // namespace leantron::ckpt
