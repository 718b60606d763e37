#include "trainer/core/run_report.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/core/grad_buffers.h"
#ifdef LEANTRON_HAVE_CUDA
#include "trainer/cuda/nn/bf16_model.h"
#endif

namespace leantron::trainer {

int64_t PeakResidentMiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) / 1024;
  }
  return 0;
}

std::string ModelBanner(const TrainArgs& args, const TrainingModel& m, const ProcessGroups& g) {
  const ckpt::ModelConfig& config = m.layout->config();
  int64_t total = 0;
  for (const ckpt::ParamSpec& p : m.layout->params())
    if (p.tied_to.empty()) total += ckpt::NumElements(p.shape);
  // An uneven split (--decoder-first/last-pipeline-num-layers) shows each stage's layers.
  std::string uneven;
  const ckpt::ParallelConfig& par = m.layout->parallel();
  if (par.first_stage_layers > 0 || par.last_stage_layers > 0) {
    for (int s = 0; s < par.pp; ++s) {
      const auto [first, last] = m.layout->StageLayers(s, 0);
      absl::StrAppend(&uneven, s == 0 ? " (layers per stage " : ", ", last - first);
    }
    uneven += ")";
  }
  return absl::StrFormat(
      "> building GPT model: %d layers, hidden %d, heads %d, ffn %d, padded vocab %d, %d "
      "parameters; TP %d%s PP %d%s (x%d virtual) DP %d%s%s; %d micro-batches per step\n",
      config.num_layers, config.hidden_size, config.num_attention_heads, config.ffn_hidden_size,
      m.layout->padded_vocab_size(), total, g.sizes.tp,
      g.sizes.cp > 1 ? absl::StrFormat(" CP %d (%s)", g.sizes.cp, args.cp_comm_type) : "",
      g.sizes.pp, uneven, args.virtual_pipeline_size(), g.sizes.dp,
      args.sequence_parallel ? " +SP" : "",
      !args.use_distributed_optimizer ? ""
      : args.data_parallel_sharding_strategy == "optim_grads"
          ? " +distributed optimizer, sharded gradients"
      : args.data_parallel_sharding_strategy == "optim_grads_params"
          ? " +distributed optimizer, sharded gradients and weights"
          : " +distributed optimizer",
      args.num_micro_batches());
}

std::string MemoryLine(const TrainArgs& args, const TrainingModel& m, const ProcessGroups& g,
                       int64_t iteration) {
  std::string gpu;
#ifdef LEANTRON_HAVE_CUDA
  if (args.backend == "cuda") {
    int64_t acts = 0;
    for (const StageModel* c : m.chunks) acts += c->activation_bytes();
    // The bf16 copy is the model's memory, or the store's with the fp32 weights sharded.
    acts += static_cast<int64_t>(m.params->bf16_backend_bytes());
    const int64_t params = static_cast<int64_t>(m.params->backend_elements()) * 4;
    const int64_t grads = static_cast<int64_t>(m.params->grads().backend_elements()) * 4;
    const int64_t host_adam = static_cast<int64_t>(m.optimizer->host_state_elements()) * 8;
    const int64_t adam = static_cast<int64_t>(m.optimizer->state_elements()) * 8 - host_adam;
    const int64_t host_weights = static_cast<int64_t>(m.params->host_elements()) * 4;
    const bool host_part = m.params->offloaded() && m.params->sharded();
    const bool host = m.optimizer->state_on_host();
    gpu = absl::StrFormat(
        " GPU in use: %d | of which %s %d, gradients%s %d, Adam state %d, bf16 "
        "weights, activations and workspaces %d |",
        cuda::DeviceMemoryInUse() >> 20,
        m.params->host_master() || host_part ? "fp32 norms and embeddings"
        : host ? "fp32 weights (the GPU's part; norms and embeddings whole)"
        : m.params->master() == MasterWeights::kShardedCompute
            ? "fp32 weights (sharded: layers in slots, this rank's parts, embeddings and head "
              "whole)"
        : m.params->sharded() ? "fp32 weights (this rank's part, norms and embeddings whole)"
                              : "parameters",
        params >> 20, m.params->grads().sharded() ? " (sharded)" : "", grads >> 20, adam >> 20,
        acts >> 20);
    if (host) {
      absl::StrAppendFormat(
          &gpu, " host (--optimizer-cpu-offload): fp32 weights%s %d, Adam state %d |",
          host_part ? " (this rank's part)" : "", host_weights >> 20, host_adam >> 20);
    }
  }
#endif
  return absl::StrFormat("[Rank %d] (after %d iterations) memory (MB) | max resident: %d |%s\n",
                         g.world_rank, iteration, PeakResidentMiB(), gpu);
}

// What gradients or weights kept in slots (ZeRO-2/3) hold: `held` bytes against `whole` for
// whole ones; when that is more, why.
std::string SlotNote(double held, double whole, const char* parts, const ProcessGroups& g) {
  std::string note = absl::StrCat(" (sharded: layer buckets taking turns in slots, ", parts,
                                  ", embeddings and head whole");
  if (held > whole) {
    absl::StrAppendFormat(&note, "; more than the %.1f MB of whole ones: %s", whole / (1 << 20),
                          g.sizes.dp * g.sizes.cp == 1
                              ? "one data-parallel rank has nothing to share them with"
                              : "a smaller --ddp-bucket-size shards more");
  }
  return note + ")";
}

// One line per rank: where it sits, what it holds, its memory and its communication share, so
// uneven pipeline memory and communication cost are visible without outside tools.
std::string RankReport(const TrainArgs& args, const TrainingModel& m, const ProcessGroups& g,
                       const RunTimes& t) {
  std::string out, layers;
  for (const StageModel* c : m.chunks) {
    absl::StrAppend(&layers, layers.empty() ? "" : ", ", "[", c->first_layer(), ", ",
                    c->last_layer(), ")", c->first_stage() ? " +embedding" : "",
                    c->last_stage() ? " +output" : "");
  }
  // What this rank holds: every fp32 weight, or its part of them (the distributed optimizer of the
  // bf16 model) beside the norms and embeddings the model reads in fp32, or (offloaded) all of
  // them on the host and those tensors here.
  const double grads_mb = m.params->grads().backend_elements() * 4.0 / (1 << 20);
  const double whole = static_cast<double>(m.params->size());
  const std::string grads_note =
      m.params->grads().sharded()
          ? SlotNote(m.params->grads().backend_elements() * 4.0, whole * 4, "their parts' sums", g)
          : "";
  const double backend_mb = m.params->backend_elements() * 4.0 / (1 << 20);
  const double adam_mb = m.optimizer->state_elements() * 8.0 / (1 << 20);
  std::string weights = absl::StrFormat("fp32 weights %.1f MB", backend_mb);
  const double host_mb = m.params->host_elements() * 4.0 / (1 << 20);
  if (m.params->offloaded() && m.params->sharded()) {
    weights = absl::StrFormat(
        "fp32 weights %.1f MB on the host (its part; norms and embeddings %.1f MB here, whole)",
        host_mb, backend_mb);
  } else if (m.params->master() == MasterWeights::kShardedCompute) {
    absl::StrAppend(&weights, SlotNote(backend_mb * (1 << 20), whole * 4, "their parts", g));
  } else if (m.params->sharded()) {
    absl::StrAppend(&weights, " (its part; norms and embeddings whole)");
    if (m.params->weights() != nullptr)
      absl::StrAppendFormat(&weights, " + bf16 weights %.1f MB%s",
                            m.params->bf16_backend_bytes() / double(1 << 20),
                            SlotNote(m.params->bf16_backend_bytes(), whole * 2, "their parts", g));
  } else if (m.params->offloaded()) {
    weights = m.params->host_master()
                  ? absl::StrFormat(
                        "fp32 weights %.1f MB on the host (norms and embeddings %.1f MB here)",
                        host_mb, backend_mb)
                  : absl::StrFormat(
                        "fp32 weights %.1f MB on the host, %.1f MB here (with norms and "
                        "embeddings)",
                        host_mb, backend_mb);
  }
  // Gloo calls are timed on the host; on GPUs the split comes from device events (below).
  const std::string comm =
      args.backend == "cuda"
          ? absl::StrFormat("%d iterations in %.2f s", t.iterations, t.train_seconds)
          : absl::StrFormat(
                "communication and waiting for peers %.2f s of %.2f s in %d iterations (%.1f%%)",
                t.comm_seconds, t.train_seconds, t.iterations,
                t.train_seconds > 0 ? 100.0 * t.comm_seconds / t.train_seconds : 0.0);
  absl::StrAppendFormat(
      &out,
      "[Rank %d] tp %d pp %d dp %d%s | layers %s | parameters %d | %s + gradients %.1f MB%s + "
      "Adam state %.1f MB%s | peak resident %d MB | %s\n",
      g.world_rank, g.coords.tp, g.coords.pp, g.coords.dp,
      g.sizes.cp > 1 ? absl::StrFormat(" cp %d", g.coords.cp) : "", layers, m.params->size(),
      weights, grads_mb, grads_note, adam_mb,
      !m.optimizer->state_on_host() ? std::string()
      : m.optimizer->host_state_elements() == m.optimizer->state_elements()
          ? std::string(" on the host")
          : absl::StrFormat(" (%.1f MB of it on the host)",
                            m.optimizer->host_state_elements() * 8.0 / (1 << 20)),
      PeakResidentMiB(), comm);
  if (m.optimizer->state_on_host()) {
    absl::StrAppendFormat(
        &out,
        "[Rank %d] optimizer on the host (%d threads): fp32 weights and Adam state there, %.1f "
        "ms per step from the first gradient piece down to the last weights queued up, %.1f ms "
        "of it stepping%s\n",
        g.world_rank, m.optimizer->host_threads(), m.optimizer->host_step_ms(),
        m.optimizer->host_compute_ms(),
        m.optimizer->host_step_overlapped()
            ? absl::StrFormat(", beside the next forward, whose issuing waited %.1f ms for it",
                              m.optimizer->host_waited_ms())
            : "");
  }
  // Context parallelism's share: the host sees the time inside the cp group's Gloo calls (the
  // waits for blocks that had not arrived), not transfers that ran while a block computed.
  if (g.sizes.cp > 1 && args.backend != "cuda") {
    absl::StrAppendFormat(
        &out,
        "[Rank %d] context-parallel communication (%s): %.2f s exposed (inside the cp group's "
        "calls, %.1f%% of training), hidden 0.00 s (overlap with compute is not measured on "
        "CPUs; counted as none)\n",
        g.world_rank, args.cp_comm_type, t.cp_comm_seconds,
        t.train_seconds > 0 ? 100.0 * t.cp_comm_seconds / t.train_seconds : 0.0);
  }
  // With recomputation on, what each chunk's backwards redid (so a test can see it happened).
  if (!args.recompute_granularity.empty()) {
    for (const StageModel* c : m.chunks) {
      absl::StrAppendFormat(
          &out,
          "[Rank %d] layers [%d, %d): recomputed %d layer forwards and %d attention softmaxes\n",
          g.world_rank, c->first_layer(), c->last_layer(), c->recomputed_layers(),
          c->recomputed_softmaxes());
    }
  }
  double compute = 0, tp_comm = 0, dp_exposed = 0;
  bool measured = t.steady_iters > 0;
  for (const StageModel* c : m.chunks) {
    double cm = 0, tc = 0;
    measured = measured && c->StepTimes(&cm, &tc);
    compute += cm;
    tp_comm += tc;
  }
  for (const auto& l : m.listeners) dp_exposed += l->ExposedMsPerStep();
  if (measured) {
    const double step = t.steady_ms / t.steady_iters, wait = t.pipeline_wait_ms / t.steady_iters;
    absl::StrAppendFormat(
        &out,
        "[Rank %d] step time %.1f ms (mean after the first iteration) = GPU compute %.1f + "
        "tensor-parallel communication %.1f + pipeline waits (bubble and stage transfers) %.1f + "
        "exposed data-parallel communication %.1f + rest (optimizer, host) %.1f\n",
        g.world_rank, step, compute, tp_comm, wait, dp_exposed,
        step - compute - tp_comm - wait - dp_exposed);
  }
  double fp8 = 0, casts = 0, bf16 = 0;
  bool split = t.steady_iters > 0;
  for (const StageModel* c : m.chunks) {
    double f = 0, ca = 0, b = 0;
    split = split && c->ProductTimes(&f, &ca, &b);
    fp8 += f;
    casts += ca;
    bf16 += b;
  }
  if (split) {
    absl::StrAppendFormat(&out,
                          "[Rank %d] of the GPU compute, per step: FP8 products %.1f ms, FP8 casts "
                          "%.1f ms, bf16 products %.1f ms\n",
                          g.world_rank, fp8, casts, bf16);
  }
  for (const auto& l : m.listeners) {
    if (std::string r = l->Report(); !r.empty())
      absl::StrAppendFormat(&out, "[Rank %d] %s\n", g.world_rank, r);
  }
#ifdef LEANTRON_HAVE_CUDA
  if (args.backend == "cuda") {
    absl::StrAppendFormat(&out, "[Rank %d] GPU memory in use at the end: %d MB\n", g.world_rank,
                          cuda::DeviceMemoryInUse() >> 20);
  }
#endif
  return out;
}

}  // namespace leantron::trainer
