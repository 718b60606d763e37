#include "trainer/core/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "libckpt/checkpoint_metadata.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/checkpoint_source.h"
#include "libckpt/checkpoint_writer.h"
#include "libckpt/safetensors.h"
#include "libckpt/safetensors_writer.h"

namespace leantron::trainer {
namespace {

// Every rank learns whether any rank failed; the first failing rank's message stays local, the
// others report which step failed.
absl::Status AgreeOnFailure(Communicator& world, const absl::Status& local, const char* step) {
  float failed = local.ok() ? 0.0f : 1.0f;
  world.AllReduceMax(&failed, 1);
  if (!local.ok()) return local;
  if (failed > 0.0f)
    return absl::InternalError(absl::StrCat("checkpoint ", step, " failed on another rank"));
  return absl::OkStatus();
}

std::vector<ckpt::RankTensor> Tensors(const ParamStore& params, const float* base) {
  std::vector<ckpt::RankTensor> out;
  for (const ParamView& v : params.views()) {
    out.push_back({v.name, std::as_bytes(std::span<const float>(base + v.offset, v.numel))});
  }
  return out;
}

// FP8 scaling state: a float32 tensor per model chunk ("chunk<v>") in each (tp, pp) shard's
// directory, loaded only into a run of the same recipe and layout (its signature).
constexpr char kFp8StateFile[] = "fp8_state.safetensors";
constexpr char kFp8SignatureKey[] = "leantron_fp8_scaling";

std::string Fp8Signature(const TrainArgs& a, const ckpt::ParallelConfig& p) {
  const bool ends = a.first_last_layers_bf16;
  return absl::StrCat("format ", a.fp8_format, ", recipe ", a.fp8_recipe, ", amax history ",
                      a.fp8_recipe == "delayed" ? a.fp8_amax_history_len : 1,
                      ", bf16 layers at the start ", ends ? a.num_layers_at_start_in_bf16 : 0,
                      " and end ", ends ? a.num_layers_at_end_in_bf16 : 0,
                      a.fp8_output_layer ? ", output layer in FP8" : "", ", TP ", p.tp, ", PP ",
                      p.pp, ", VPP ", p.vpp);
}

std::string Fp8StatePath(const std::string& iteration_dir, const ckpt::ModelLayout& layout,
                         const ProcessGroups& g) {
  return absl::StrCat(iteration_dir, "/", layout.ShardDirName(g.coords.tp, g.coords.pp), "/",
                      kFp8StateFile);
}

absl::Status SaveFp8State(const TrainArgs& args, const std::string& temp_dir,
                          const ckpt::ModelLayout& layout, const ProcessGroups& g,
                          const std::vector<StageModel*>& chunks) {
  std::vector<std::vector<float>> states;
  std::vector<ckpt::NamedTensorData> tensors;
  for (const StageModel* c : chunks) states.push_back(c->Fp8State());
  for (size_t v = 0; v < states.size(); ++v) {
    tensors.push_back({{absl::StrCat("chunk", v), ckpt::DType::kF32, {states[v].size()}},
                       std::as_bytes(std::span<const float>(states[v]))});
  }
  return ckpt::WriteSafetensors(
      Fp8StatePath(temp_dir, layout, g), tensors,
      {{"format", "pt"}, {kFp8SignatureKey, Fp8Signature(args, layout.parallel())}});
}

// Whether the state was there to load; an unreadable file is an error.
absl::StatusOr<bool> LoadFp8State(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                  const ProcessGroups& g, const std::vector<StageModel*>& chunks) {
  absl::StatusOr<std::string> dir = ckpt::ResolveIterationDir(args.load, std::nullopt);
  if (!dir.ok()) return false;  // not the project's layout (Megatron's): no FP8 state
  const std::string path = Fp8StatePath(*dir, layout, g);
  if (!std::filesystem::exists(path)) return false;
  absl::StatusOr<std::unique_ptr<ckpt::SafetensorsFile>> file = ckpt::SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  bool same = false;
  for (const auto& [key, value] : (*file)->metadata())
    same = same || (key == kFp8SignatureKey && value == Fp8Signature(args, layout.parallel()));
  if (!same) return false;
  for (size_t v = 0; v < chunks.size(); ++v) {
    std::vector<float> state = chunks[v]->Fp8State();
    absl::StatusOr<ckpt::TensorView> t = (*file)->Get(absl::StrCat("chunk", v));
    if (!t.ok()) return t.status();
    if (t->info->dtype != ckpt::DType::kF32 || t->data.size() != state.size() * sizeof(float))
      return absl::DataLossError(absl::StrCat(path, ": chunk", v, " holds ", t->data.size(),
                                              " bytes of FP8 state, not ",
                                              state.size() * sizeof(float)));
    std::memcpy(state.data(), t->data.data(), t->data.size());
    if (!state.empty()) chunks[v]->SetFp8State(state);
  }
  return true;
}

std::string RopeScalingText(const ckpt::RopeScaling& r) {
  if (!r.llama3) return "none";
  return absl::StrCat("llama3 (factor ", r.factor, ", low_freq_factor ", r.low_freq_factor,
                      ", high_freq_factor ", r.high_freq_factor,
                      ", original_max_position_embeddings ", r.original_max_position_embeddings,
                      ")");
}

absl::Status CheckSameModel(const ckpt::ModelConfig& saved, const ckpt::ModelConfig& ours) {
  auto mismatch = [](const char* what, int64_t a, int64_t b) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint has ", what, " ", a, " but this run has ", b));
  };
  if (saved.num_layers != ours.num_layers)
    return mismatch("num_layers", saved.num_layers, ours.num_layers);
  if (saved.hidden_size != ours.hidden_size)
    return mismatch("hidden_size", saved.hidden_size, ours.hidden_size);
  if (saved.num_attention_heads != ours.num_attention_heads)
    return mismatch("num_attention_heads", saved.num_attention_heads, ours.num_attention_heads);
  if (saved.ffn_hidden_size != ours.ffn_hidden_size)
    return mismatch("ffn_hidden_size", saved.ffn_hidden_size, ours.ffn_hidden_size);
  if (saved.vocab_size != ours.vocab_size)
    return mismatch("vocab_size", saved.vocab_size, ours.vocab_size);
  if (saved.max_position_embeddings != ours.max_position_embeddings)
    return mismatch("max_position_embeddings", saved.max_position_embeddings,
                    ours.max_position_embeddings);
  if (saved.num_query_groups != ours.num_query_groups)
    return mismatch("num_query_groups", saved.num_query_groups, ours.num_query_groups);
  if (saved.kv_channels != ours.kv_channels)
    return mismatch("kv_channels", saved.kv_channels, ours.kv_channels);
  if (saved.normalization != ours.normalization)
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint uses ", std::string(ckpt::NormTypeName(saved.normalization)),
                     " (--normalization)"));
  if (saved.position_embedding_type != ours.position_embedding_type)
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint uses ", std::string(ckpt::PositionEmbeddingName(saved.position_embedding_type)),
        " positions (--position-embedding-type)"));
  if (saved.untie_embeddings_and_output_weights != ours.untie_embeddings_and_output_weights)
    return absl::InvalidArgumentError(
        "checkpoint and run differ in --untie-embeddings-and-output-weights");
  if (saved.add_bias_linear != ours.add_bias_linear || saved.add_qkv_bias != ours.add_qkv_bias)
    return absl::InvalidArgumentError(
        "checkpoint and run differ in linear biases (--disable-bias-linear, --add-qkv-bias)");
  if (saved.activation != ours.activation) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint uses ", std::string(ckpt::ActivationName(saved.activation)),
                     " but this run uses ", std::string(ckpt::ActivationName(ours.activation)),
                     " (--openai-gelu selects gelu_tanh)"));
  }
  // Fields that change the function without changing a shape: a mismatch would load silently.
  if (saved.norm_epsilon != ours.norm_epsilon)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint has norm_epsilon ",
                                                   saved.norm_epsilon, " but this run has ",
                                                   ours.norm_epsilon, " (--norm-epsilon)"));
  if (saved.position_embedding_type == ckpt::PositionEmbedding::kRope &&
      saved.rotary_base != ours.rotary_base)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint has rotary_base ", saved.rotary_base,
                                                   " but this run has ", ours.rotary_base,
                                                   " (--rotary-base)"));
  if (!(saved.rope_scaling == ours.rope_scaling)) {
    std::string message = absl::StrCat(
        "checkpoint has rope_scaling ", RopeScalingText(saved.rope_scaling), " but this run has ",
        RopeScalingText(ours.rope_scaling), " (--use-rope-scaling, --rope-scaling-factor)");
    const ckpt::RopeScaling fixed;  // What --use-rope-scaling sets besides the factor.
    const ckpt::RopeScaling& r = saved.rope_scaling;
    if (r.llama3 && (r.low_freq_factor != fixed.low_freq_factor ||
                     r.high_freq_factor != fixed.high_freq_factor ||
                     r.original_max_position_embeddings != fixed.original_max_position_embeddings))
      absl::StrAppend(&message, "; --use-rope-scaling gives low_freq_factor ",
                      fixed.low_freq_factor, ", high_freq_factor ", fixed.high_freq_factor,
                      " and original_max_position_embeddings ",
                      fixed.original_max_position_embeddings, " as Megatron's does");
    return absl::InvalidArgumentError(message);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveTrainingCheckpoint(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                    ProcessGroups& groups, ParamStore& params, Optimizer& optimizer,
                                    const std::vector<StageModel*>& chunks,
                                    const TrainPosition& position) {
  Communicator& world = *groups.world;
  std::vector<float> exp_avg, exp_avg_sq, host;
  // The model is replicated over DP and CP: the (tp, pp) ranks of one replica write.
  const bool writer = groups.coords.dp == 0 && groups.coords.cp == 0;
  // The fp32 weights whole: in host memory already (--optimizer-cpu-offload), written from where
  // they are; otherwise made whole (collective over DP × CP) and copied to the host.
  const float* weights = params.data();
  if (!params.host_master()) {
    optimizer.GatherMaster(writer ? &host : nullptr);
    weights = host.data();
  }
  // Moments and weights already whole in host memory (--optimizer-cpu-offload) are written from
  // where they are, not copied (they may fill most of the host).
  float *m = nullptr, *v = nullptr;
  if (!optimizer.HostState(&m, &v)) {
    // Collective over DP × CP; only the writers keep them (each holds the whole shard's).
    optimizer.GatherState(writer ? &exp_avg : nullptr, writer ? &exp_avg_sq : nullptr);
    m = exp_avg.data();
    v = exp_avg_sq.data();
  }

  if (!args.fp8_format.empty())
    for (StageModel* c : chunks) c->SyncFp8State();  // collective over DP, before the writers read
  absl::Status st;
  std::string temp_dir;
  if (groups.world_rank == 0) {
    absl::StatusOr<std::string> t = ckpt::PrepareCheckpointSave(args.save, position.iteration);
    st = t.status();
  }
  if (absl::Status s = AgreeOnFailure(world, st, "preparation"); !s.ok()) return s;
  temp_dir = absl::StrCat(args.save, "/", ckpt::IterationDirName(position.iteration), ".tmp");

  st = absl::OkStatus();
  if (writer) {
    const std::vector<ckpt::RankTensor> p = Tensors(params, weights);
    std::vector<ckpt::RankTensor> ms, vs;
    for (const ParamView& view : params.views()) {
      ms.push_back({view.name, std::as_bytes(std::span<const float>(m + view.offset, view.numel))});
      vs.push_back({view.name, std::as_bytes(std::span<const float>(v + view.offset, view.numel))});
    }
    st =
        ckpt::WriteRankShard(temp_dir, layout, groups.coords.tp, groups.coords.pp, p, &p, &ms, &vs);
    if (st.ok() && !args.fp8_format.empty())
      st = SaveFp8State(args, temp_dir, layout, groups, chunks);
  }
  if (absl::Status s = AgreeOnFailure(world, st, "shard write"); !s.ok()) return s;

  st = absl::OkStatus();
  if (groups.world_rank == 0) {
    ckpt::CheckpointMetadata meta;
    meta.config = layout.config();
    meta.config.hf_architecture = position.hf_architecture;
    meta.parallel = layout.parallel();
    meta.iteration = position.iteration;
    meta.consumed_samples = position.consumed_train_samples;
    meta.has_optimizer = true;
    meta.optimizer_step = optimizer.step();
    meta.args_json = TrainArgsToJson(args);
    st = ckpt::CommitCheckpointSave(args.save, temp_dir, meta);
  }
  return AgreeOnFailure(world, st, "commit");
}

absl::Status LoadTrainingCheckpoint(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                    ProcessGroups& groups, ParamStore& params, Optimizer& optimizer,
                                    const std::vector<StageModel*>& chunks,
                                    TrainPosition* position) {
  absl::Status st;
  std::unique_ptr<ckpt::CheckpointSource> reader;
  {
    // One rank checks the contents (a read of every file); the others only the structure. Any
    // format OpenCheckpoint reads: the project's own, or Megatron-LM's torch / torch_dist.
    const bool verify = !args.no_verify_checkpoint && groups.world_rank == 0;
    absl::StatusOr<std::unique_ptr<ckpt::CheckpointSource>> r =
        ckpt::OpenCheckpoint(args.load, std::nullopt, {.verify = verify});
    if (r.ok()) {
      reader = std::move(*r);
      st = CheckSameModel(reader->metadata().config, layout.config());
    } else {
      st = r.status();
    }
  }
  const bool load_optim = !args.finetune && !args.no_load_optim;
  if (st.ok() && load_optim && !reader->has_optimizer()) {
    st = absl::FailedPreconditionError(
        absl::StrCat(args.load, " has no optimizer state; pass --no-load-optim or --finetune"));
  }
  if (absl::Status s = AgreeOnFailure(*groups.world, st, "load"); !s.ok()) return s;

  const int tp_rank = groups.coords.tp;
  // Read in place where the weights and moments are whole in host memory (offloaded), else
  // tensor by tensor through host copies of one tensor: never the whole shard on every rank
  // (12 bytes per parameter, more than a host that fits only this rank's part may have).
  std::vector<float> exp_avg, exp_avg_sq, param;
  float *m = nullptr, *v_state = nullptr;
  const bool host_state = optimizer.HostState(&m, &v_state);
  float* weights = params.host_master() ? params.data() : nullptr;
  ckpt::Tensor full;
  auto read_into = [&](const ParamView& v, ckpt::TensorKind kind, float* dst) -> absl::Status {
    if (absl::Status s = reader->ReadFull(*v.spec, kind, &full); !s.ok()) return s;
    // bf16 / fp16 weights (Megatron's, when the fp32 main weights are not loaded) widen exactly.
    if (full.dtype == ckpt::DType::kBF16 || full.dtype == ckpt::DType::kF16) {
      std::vector<std::byte> wide(full.data.size() * 2);
      const auto* in = reinterpret_cast<const uint16_t*>(full.data.data());
      auto* out = reinterpret_cast<float*>(wide.data());
      for (size_t i = 0; i < full.data.size() / 2; ++i) {
        out[i] = full.dtype == ckpt::DType::kBF16 ? ckpt::BFloat16ToFloat(in[i])
                                                  : ckpt::HalfToFloat(in[i]);
      }
      full.data = std::move(wide);
      full.dtype = ckpt::DType::kF32;
    }
    if (full.dtype != ckpt::DType::kF32)
      return absl::InvalidArgumentError(absl::StrCat(v.name, ": not float32"));
    layout.ExtractShard(*v.spec, tp_rank, sizeof(float), full.bytes(),
                        std::as_writable_bytes(std::span<float>(dst, v.numel)));
    return absl::OkStatus();
  };
  st = absl::OkStatus();
  for (const ParamView& v : params.views()) {
    // The fp32 main weights are the truth when present; the model copy equals them in fp32 runs.
    const ckpt::TensorKind kind =
        load_optim ? ckpt::TensorKind::kMainParam : ckpt::TensorKind::kParam;
    if (weights == nullptr) param.resize(v.numel);
    float* w = weights != nullptr ? weights + v.offset : param.data();
    st = read_into(v, kind, w);
    if (!st.ok()) break;
    params.SetFromHost(v, w);
    if (!load_optim) continue;
    if (!host_state) {
      exp_avg.resize(v.numel);
      exp_avg_sq.resize(v.numel);
    }
    float* vm = host_state ? m + v.offset : exp_avg.data();
    float* vv = host_state ? v_state + v.offset : exp_avg_sq.data();
    st = read_into(v, ckpt::TensorKind::kExpAvg, vm);
    if (st.ok()) st = read_into(v, ckpt::TensorKind::kExpAvgSq, vv);
    if (!st.ok()) break;
    if (!host_state) optimizer.SetState(v.offset, v.offset + v.numel, vm, vv);
  }
  if (absl::Status s = AgreeOnFailure(*groups.world, st, "tensor read"); !s.ok()) return s;
  if (!args.fp8_format.empty() && !args.finetune) {
    absl::StatusOr<bool> loaded = LoadFp8State(args, layout, groups, chunks);
    position->fp8_state_loaded = loaded.value_or(false);
    if (absl::Status s = AgreeOnFailure(*groups.world, loaded.status(), "FP8 state read"); !s.ok())
      return s;
  }
  if (load_optim) optimizer.set_step(reader->metadata().optimizer_step);
  position->hf_architecture = reader->metadata().config.hf_architecture;
  if (!args.finetune) {
    position->iteration = reader->metadata().iteration < 0 ? 0 : reader->metadata().iteration;
    position->consumed_train_samples = reader->metadata().consumed_samples;
  }
  return absl::OkStatus();
}

}  // namespace leantron::trainer
