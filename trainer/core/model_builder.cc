#include "trainer/core/model_builder.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "trainer/core/host_step_waits.h"
#include "trainer/core/slot_grad_reducer.h"
#include "trainer/core/slot_weight_gatherer.h"
#include "trainer/reference/model.h"
#ifdef LEANTRON_HAVE_CUDA
#include "trainer/cuda/nn/bf16_model.h"
#include "trainer/cuda/parallel/grad_reduce.h"
#include "trainer/cuda/parallel/weight_gather.h"
#include "trainer/dist/nccl_comm.h"
#endif

namespace leantron::trainer {
namespace {

// The cores this process may run on (its affinity mask: a container's or a launcher's limit).
int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

ModelOptions ModelOptionsFromArgs(const TrainArgs& args) {
  ModelOptions mo;
  mo.micro_batch = args.micro_batch_size;
  mo.seq_length = args.seq_length;
  mo.hidden_dropout = static_cast<float>(args.hidden_dropout);
  mo.attention_dropout = static_cast<float>(args.attention_dropout);
  mo.sequence_parallel = args.sequence_parallel;
  mo.seed = args.seed;
  // Layers keep only their input when recomputed: uniform recomputes every layer (each layer
  // input is a checkpoint, whatever the block size), block the first N of each model chunk.
  if (args.recompute_granularity == "full") {
    mo.recompute_layers = args.recompute_method == "uniform"
                              ? static_cast<int>(args.num_layers)
                              : static_cast<int>(args.recompute_num_layers);
  }
  const bool selective = args.recompute_granularity == "selective";
  auto module = [&](const char* name) {
    return selective && absl::c_linear_search(args.recompute_modules, name);
  };
  mo.recompute_attention = module("core_attn");
  mo.recompute_norms = module("layernorm");
  mo.recompute_mlp = module("mlp");
  mo.cp_comm_type = ParseCpCommType(args.cp_comm_type).value_or(CpCommType::kP2P);
  return mo;
}

#ifdef LEANTRON_HAVE_CUDA
// The bf16 chunks, and on each the data-parallel gradient reducer when DP runs over NCCL.
absl::Status BuildBf16Chunks(const TrainArgs& args, ProcessGroups& g,
                             const std::vector<std::vector<DpBucket>>& chunk_buckets,
                             TrainingModel* m) {
  cuda::Bf16Options bo;
  bo.model = ModelOptionsFromArgs(args);
  bo.loss_scale = 1.0f / static_cast<float>(args.num_micro_batches());
  bo.recompute_gelu = args.recompute_gelu;
  bo.tp = g.tp.get();
  bo.pp_rank = g.coords.pp;
  bo.tp_copy_engine = !args.no_tp_copy_engine;
  bo.profile_ops = args.timing_log_level >= 2;
  bo.deterministic = args.deterministic_mode;
  if (!args.fp8_format.empty()) {
    cuda::Fp8Options& f = bo.fp8;
    f.enabled = true;
    f.hybrid = args.fp8_format == "hybrid";
    f.delayed = args.fp8_recipe == "delayed";
    f.amax_history_len = args.fp8_amax_history_len;
    f.amax_most_recent = args.fp8_amax_compute_algo == "most_recent";
    f.margin = static_cast<float>(args.fp8_margin);
    if (args.first_last_layers_bf16) {
      f.bf16_layers_start = args.num_layers_at_start_in_bf16;
      f.bf16_layers_end = args.num_layers_at_end_in_bf16;
    }
    f.output_layer = args.fp8_output_layer;
    bo.fp8_amax_group = &g.data_parallel_with_cp();
  }
  for (int v = 0; v < args.virtual_pipeline_size(); ++v) {
    bo.virtual_chunk = v;
    absl::StatusOr<std::unique_ptr<StageModel>> model =
        cuda::CreateBf16Model(*m->layout, m->params.get(), bo);
    if (!model.ok()) return model.status();
    m->models.push_back(std::move(*model));
  }
  // Gradients are summed over the data-parallel group with context parallel (as Megatron's).
  // Sharded gradients need a reducer on one rank too (it adds the slots into the sums).
  NcclCommunicator* dp = AsNccl(&g.data_parallel_with_cp());
  ParamStore& p = *m->params;
  const bool sharded_grads = p.grads().sharded();
  if ((dp == nullptr || dp->size() <= 1) && !sharded_grads) return absl::OkStatus();
  if (dp == nullptr && g.data_parallel_with_cp().size() > 1)
    return absl::InternalError("the bf16 model's data-parallel group is not an NCCL one");
  if (dp != nullptr && dp->size() <= 1) dp = nullptr;
  cuda::GradReducer::Options ro;
  ro.overlap_grad_reduce = args.overlap_grad_reduce;
  ro.distributed = args.use_distributed_optimizer;
  ro.overlap_param_gather = args.overlap_param_gather;
  ro.reduce_in_bf16 = args.grad_reduce_in_bf16;
  ro.copy_engine = !args.no_dp_copy_engine;
  ro.num_micro_batches = static_cast<int>(args.num_micro_batches());
  if (sharded_grads) ro.sharded_grads = &p.grads();
  for (int v = 0; v < args.virtual_pipeline_size(); ++v) {
    ro.first_layer = m->models[v]->first_layer();
    // The weights it gathers (distributed optimizer): the fp32 ones and the bf16 copy, or with
    // the fp32 ones sharded (on the backend or, offloaded, on the host: no data()) the bf16 copy
    // and the mirror; offloaded on one data-parallel rank there is nothing to gather.
    auto reducer = std::make_unique<cuda::GradReducer>(
        dp, p.grad(), p.master() == MasterWeights::kWhole ? p.data() : nullptr,
        reinterpret_cast<cuda::bf16*>(p.bf16_copy()), chunk_buckets[v], ro);
    reducer->Follow(&p);
    m->models[v]->AddListener(reducer.get());
    m->listeners.push_back(std::move(reducer));
    if (p.weights() == nullptr) continue;
    // After the reducer: its StepBegins gathers the whole buffers and the mirror first.
    auto gatherer = std::make_unique<cuda::WeightGatherer>(dp, &p, chunk_buckets[v]);
    m->models[v]->AddListener(gatherer.get());
    m->listeners.push_back(std::move(gatherer));
  }
  return absl::OkStatus();
}
#endif

}  // namespace

absl::StatusOr<TrainingModel> BuildTrainingModel(const TrainArgs& args, ProcessGroups& g,
                                                 int local_ranks) {
  TrainingModel m;
  absl::StatusOr<std::unique_ptr<Ops>> ops = CreateOps(args.backend);
  if (!ops.ok()) return ops.status();
  m.ops = std::move(*ops);
  absl::StatusOr<ckpt::ModelLayout> layout =
      ckpt::ModelLayout::Create(ModelConfigFromArgs(args), ParallelConfigFromArgs(args));
  if (!layout.ok()) return layout.status();
  m.layout = std::make_unique<ckpt::ModelLayout>(std::move(*layout));
  // The fp32 weights: with the distributed optimizer of the bf16 model over DP × CP > 1 only
  // this rank's parts (the model computes with its bf16 copy, and with an fp32 mirror of the
  // norms and embeddings), otherwise all of them; on the host with --optimizer-cpu-offload.
  // With optim_grads_params (ZeRO-3) the weights the model computes with are sharded too, on
  // any number of ranks: the bf16 copy beside the fp32 parts, or for the float32 model the fp32
  // weights themselves.
  Communicator& dp_cp = g.data_parallel_with_cp();
  const bool shard_weights = args.data_parallel_sharding_strategy == "optim_grads_params";
  const bool shard_master =
      args.bf16 && args.use_distributed_optimizer && (dp_cp.size() > 1 || shard_weights);
  MasterWeights master = args.optimizer_cpu_offload
                             ? (shard_master ? MasterWeights::kHostSharded : MasterWeights::kHost)
                             : (shard_master ? MasterWeights::kSharded : MasterWeights::kWhole);
  if (shard_weights && !args.bf16) master = MasterWeights::kShardedCompute;
  m.params =
      std::make_unique<ParamStore>(m.ops.get(), *m.layout, g.coords.tp, g.coords.pp,
                                   args.sequence_parallel, master, args.optimizer_offload_fraction);
  // Data-parallel buckets, per model chunk: the reducer reduces (and gathers) its chunk's, the
  // optimizer owns a part of each of them with the distributed optimizer.
  const int vpp = args.virtual_pipeline_size();
  std::vector<std::vector<DpBucket>> chunk_buckets;
  std::vector<DpBucket> all_buckets;
  for (int v = 0; v < vpp; ++v) {
    const auto [first, last] = m.layout->StageLayers(g.coords.pp, v);
    chunk_buckets.push_back(PlanDpBuckets(*m.params, first, last, g.coords.pp == 0 && v == 0,
                                          g.coords.pp == g.sizes.pp - 1 && v == vpp - 1,
                                          static_cast<size_t>(args.ddp_bucket_size)));
    all_buckets.insert(all_buckets.end(), chunk_buckets.back().begin(), chunk_buckets.back().end());
  }
  // ZeRO-3: the layers' weights in slots, each rank keeping its parts (before the shard, whose
  // fp32 weights they may be, and before a model binds them).
  if (shard_weights) m.params->ShardWeights(chunk_buckets, dp_cp.rank(), dp_cp.size());
  if (m.params->sharded())
    m.params->SetShard(DpOwnedParts(all_buckets, dp_cp.rank(), dp_cp.size()));
  // ZeRO-2 (and 3): the layers' gradients in slots, each rank keeping the sum of its parts
  // (before a model binds its gradients).
  const bool shard_grads = args.data_parallel_sharding_strategy == "optim_grads" || shard_weights;
  if (shard_grads) m.params->ShardGrads(chunk_buckets, dp_cp.rank(), dp_cp.size());
  m.params->Initialize(args.seed, args.init_method_std);
  if (args.bf16) {
#ifdef LEANTRON_HAVE_CUDA
    if (absl::Status s = BuildBf16Chunks(args, g, chunk_buckets, &m); !s.ok()) return s;
#else
    return absl::UnimplementedError("--bf16 needs a build with CUDA");
#endif
  } else {
    const ModelOptions mo = ModelOptionsFromArgs(args);
    if (mo.recompute_norms || mo.recompute_mlp)
      return absl::UnimplementedError(
          absl::StrCat("--recompute-modules ", mo.recompute_norms ? "layernorm" : "mlp",
                       " is implemented in the bf16 model (--bf16); the float32 model keeps its ",
                       mo.recompute_norms ? "norm" : "MLP", " outputs"));
    for (int v = 0; v < vpp; ++v) {
      m.models.push_back(std::make_unique<ReferenceModel>(
          m.ops.get(), *m.layout, g.tp.get(), g.cp.get(), m.params.get(), g.coords.pp, v, mo));
    }
  }
  for (const std::unique_ptr<StageModel>& model : m.models) m.chunks.push_back(model.get());

  OptimizerOptions oo;
  oo.beta1 = static_cast<float>(args.adam_beta1);
  oo.beta2 = static_cast<float>(args.adam_beta2);
  oo.eps = static_cast<float>(args.adam_eps);
  oo.weight_decay = static_cast<float>(args.weight_decay);
  oo.clip_grad = static_cast<float>(args.clip_grad);
  oo.distributed = args.use_distributed_optimizer;
  oo.buckets = std::move(all_buckets);
  oo.dp_by_reducer = !m.listeners.empty();  // the bf16 model's GradReducers
  if (shard_grads && !oo.dp_by_reducer) {
    // The float32 model: the layer buckets summed as the backward finishes them; the optimizer
    // sums the rest.
    for (int v = 0; v < vpp; ++v) {
      auto reducer = std::make_unique<SlotGradReducer>(m.ops.get(), &dp_cp, &m.params->grads(),
                                                       chunk_buckets[v]);
      m.models[v]->AddListener(reducer.get());
      m.listeners.push_back(std::move(reducer));
      if (!shard_weights) continue;
      auto gatherer = std::make_unique<SlotWeightGatherer>(m.ops.get(), &dp_cp, m.params.get(),
                                                           chunk_buckets[v]);
      m.models[v]->AddListener(gatherer.get());
      m.listeners.push_back(std::move(gatherer));
    }
  }
  oo.cpu_offload = args.optimizer_cpu_offload;
  // The offloaded step runs beside the next forward (the bf16 model, the only one that offloads,
  // announces which weights it reads), on every core of the rank's share but the one that issues
  // the forward.
  oo.overlap_host_step = master == MasterWeights::kHost && args.bf16;
  const int cores = std::max(1, UsableCores() / std::max(1, local_ranks));
  oo.host_threads = oo.overlap_host_step ? std::max(1, cores - 1) : cores;
  m.optimizer = std::make_unique<Optimizer>(m.ops.get(), m.params.get(), &g, oo);
  for (StageModel* chunk : m.chunks) {
    if (StepCopies* copies = chunk->step_copies()) m.optimizer->AddStepCopies(copies);
    if (oo.overlap_host_step) {
      auto waits = std::make_unique<HostStepWaits>(m.optimizer.get(), *m.params,
                                                   chunk->first_layer(), chunk->last_layer());
      chunk->AddListener(waits.get());
      m.listeners.push_back(std::move(waits));
    }
  }
  return m;
}

}  // namespace leantron::trainer
