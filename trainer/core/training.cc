#include "trainer/core/training.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libckpt/layout.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/data.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/core/pipeline.h"
#include "trainer/core/scheduler.h"
#include "trainer/core/tensorboard.h"
#include "trainer/dist/comm_gloo.h"
#include "trainer/reference/model.h"
#ifdef LEANTRON_HAVE_CUDA
#include "trainer/cuda/nn/gpt_cuda.h"
#include "trainer/dist/nccl_comm.h"
#endif

namespace leantron::trainer {
namespace {

volatile std::sig_atomic_t g_stop_requested = 0;
void OnStopSignal(int) { g_stop_requested = 1; }

std::string Timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm;
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int64_t PeakResidentMiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) / 1024;
  }
  return 0;
}

// Every rank agrees whether any rank failed (data errors are found before any compute).
absl::Status Agree(Communicator& world, const absl::Status& local) {
  float failed = local.ok() ? 0.0f : 1.0f;
  world.AllReduceMax(&failed, 1);
  if (!local.ok()) return local;
  if (failed > 0.0f) return absl::AbortedError("another rank failed");
  return absl::OkStatus();
}

class Trainer {
 public:
  Trainer(const TrainArgs& args, ProcessGroups& groups) : args_(args), g_(groups) {}

  absl::Status Run();

 private:
  absl::Status GetMicroBatches(data::SplitKind kind, int64_t consumed, bool training,
                               std::vector<MicroBatch>* out);
  absl::Status Evaluate(int64_t iteration, int64_t index);
  absl::Status Save(const TrainPosition& position);
  bool logging_rank() const { return g_.world_rank == g_.sizes.world() - 1; }
  void Print(const std::string& s) {
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  }

  const TrainArgs& args_;
  ProcessGroups& g_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<ckpt::ModelLayout> layout_;
  std::unique_ptr<ParamStore> params_;
  std::vector<std::unique_ptr<StageModel>> models_;  // this stage's model chunks
  std::vector<StageModel*> chunks_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BatchSource> data_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // logging rank only
  double comm_seconds_ = 0.0;                       // spent inside any communicator
  double train_seconds_ = 0.0;                      // spent in training iterations
  // After the first iteration (warm-up): wall time, and the GPU's waits for pipeline data.
  double steady_ms_ = 0.0, pipeline_wait_ms_ = 0.0;
  int64_t steady_iters_ = 0;
  void ReportRank(int64_t iterations);
};

// One line per rank: where it sits, what it holds, its memory and its communication share, so
// uneven pipeline memory and communication cost are visible without outside tools.
void Trainer::ReportRank(int64_t iterations) {
  std::string layers;
  for (const StageModel* m : chunks_) {
    absl::StrAppend(&layers, layers.empty() ? "" : ", ", "[", m->first_layer(), ", ",
                    m->last_layer(), ")", m->first_stage() ? " +embedding" : "",
                    m->last_stage() ? " +output" : "");
  }
  const double param_mb = params_->size() * 4.0 / (1 << 20);
  const double adam_mb = optimizer_->state_elements() * 8.0 / (1 << 20);
  // Gloo calls are timed on the host; on GPUs the split comes from device events (below).
  const std::string comm =
      args_.backend == "cuda"
          ? absl::StrFormat("%d iterations in %.2f s", iterations, train_seconds_)
          : absl::StrFormat(
                "communication and waiting for peers %.2f s of %.2f s in %d iterations (%.1f%%)",
                comm_seconds_, train_seconds_, iterations,
                train_seconds_ > 0 ? 100.0 * comm_seconds_ / train_seconds_ : 0.0);
  Print(absl::StrFormat(
      "[Rank %d] tp %d pp %d dp %d | layers %s | parameters %d: %.1f MB + gradients %.1f MB + "
      "Adam state %.1f MB | peak resident %d MB | %s\n",
      g_.world_rank, g_.coords.tp, g_.coords.pp, g_.coords.dp, layers, params_->size(), param_mb,
      param_mb, adam_mb, PeakResidentMiB(), comm));
  double compute = 0, tp_comm = 0, dp_exposed = 0;
  bool measured = steady_iters_ > 0;
  for (const StageModel* m : chunks_) {
    double c = 0, t = 0, d = 0;
    measured = measured && m->StepTimes(&c, &t, &d);
    compute += c;
    tp_comm += t;
    dp_exposed += d;
  }
  if (measured) {
    const double step = steady_ms_ / steady_iters_, wait = pipeline_wait_ms_ / steady_iters_;
    Print(absl::StrFormat(
        "[Rank %d] step time %.1f ms (mean after the first iteration) = GPU compute %.1f + "
        "tensor-parallel communication %.1f + pipeline waits (bubble and stage transfers) %.1f + "
        "exposed data-parallel communication %.1f + rest (optimizer, host) %.1f\n",
        g_.world_rank, step, compute, tp_comm, wait, dp_exposed,
        step - compute - tp_comm - wait - dp_exposed));
  }
  for (const StageModel* m : chunks_) {
    if (std::string r = m->TimeReport(); !r.empty())
      Print(absl::StrFormat("[Rank %d] %s\n", g_.world_rank, r));
  }
#ifdef LEANTRON_HAVE_CUDA
  if (args_.backend == "cuda") {
    Print(absl::StrFormat("[Rank %d] GPU memory in use at the end: %d MB\n", g_.world_rank,
                          cuda::DeviceMemoryInUse() >> 20));
  }
#endif
}

absl::Status Trainer::GetMicroBatches(data::SplitKind kind, int64_t consumed, bool training,
                                      std::vector<MicroBatch>* out) {
  const int64_t mbs = args_.micro_batch_size, dp = g_.sizes.dp;
  const int64_t m = args_.num_micro_batches();
  out->resize(m);
  absl::Status st;
  for (int64_t j = 0; j < m && st.ok(); ++j) {
    st = data_->Get(kind, consumed + j * mbs * dp + g_.coords.dp * mbs, mbs, &(*out)[j]);
    (*out)[j].training = training;
  }
  return Agree(*g_.world, st);
}

absl::Status Trainer::Evaluate(int64_t iteration, int64_t index) {
  double loss_sum = 0.0;
  int64_t count = 0;
  std::vector<MicroBatch> mbs;
  for (int64_t k = 0; k < args_.eval_iters; ++k) {
    const int64_t consumed = (index * args_.eval_iters + k) * args_.global_batch_size;
    if (absl::Status s = GetMicroBatches(data::SplitKind::kValid, consumed, false, &mbs); !s.ok())
      return s;
    loss_sum += RunSchedule(chunks_, *g_.pp, mbs, /*forward_only=*/true);
    count += static_cast<int64_t>(mbs.size());
  }
  double loss[1] = {count > 0 ? loss_sum / count : 0.0};
  g_.dp->AllReduceSumDouble(loss, 1);
  loss[0] /= g_.sizes.dp;
  if (logging_rank()) {
    const std::string line =
        absl::StrFormat(" validation loss at iteration %d | lm loss value: %E | lm loss PPL: %E | ",
                        iteration, loss[0], std::exp(std::min(20.0, loss[0])));
    if (tensorboard_) {
      tensorboard_->AddScalar("lm loss validation", loss[0], iteration);
      tensorboard_->AddScalar("lm loss validation ppl", std::exp(std::min(20.0, loss[0])),
                              iteration);
    }
    const std::string rule(line.size() + 1, '-');
    Print(absl::StrCat(rule, "\n", line, "\n", rule, "\n"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Save(const TrainPosition& position) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = SaveTrainingCheckpoint(args_, *layout_, g_, *params_, *optimizer_, position);
  if (!s.ok()) return s;
  if (g_.world_rank == 0) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Print(
        absl::StrFormat("  successfully saved checkpoint from iteration %7d to %s [ TP %d, PP %d ] "
                        "(%.1f ms)\n",
                        position.iteration, args_.save, g_.sizes.tp, g_.sizes.pp, ms));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Run() {
  // Host-side timing of Gloo calls; NCCL calls only enqueue work, so the cuda backend measures
  // its communication on the GPU instead.
  for (std::unique_ptr<Communicator>* c :
       {&g_.world, &g_.tp, &g_.dp, &g_.pp, &g_.model, &g_.embedding}) {
    if (*c && args_.backend != "cuda") *c = MakeTimedCommunicator(std::move(*c), &comm_seconds_);
  }
  absl::StatusOr<std::unique_ptr<Ops>> ops = CreateOps(args_.backend);
  if (!ops.ok()) return ops.status();
  ops_ = std::move(*ops);
  const ckpt::ModelConfig config = ModelConfigFromArgs(args_);
  absl::StatusOr<ckpt::ModelLayout> layout =
      ckpt::ModelLayout::Create(config, ParallelConfigFromArgs(args_));
  if (!layout.ok()) return layout.status();
  layout_ = std::make_unique<ckpt::ModelLayout>(std::move(*layout));
  params_ = std::make_unique<ParamStore>(ops_.get(), *layout_, g_.coords.tp, g_.coords.pp,
                                         args_.sequence_parallel);
  params_->Initialize(args_.seed, args_.init_method_std);
  ModelOptions mo;
  mo.micro_batch = args_.micro_batch_size;
  mo.seq_length = args_.seq_length;
  mo.hidden_dropout = static_cast<float>(args_.hidden_dropout);
  mo.attention_dropout = static_cast<float>(args_.attention_dropout);
  mo.sequence_parallel = args_.sequence_parallel;
  mo.seed = args_.seed;
  // Layers keep only their input when recomputed: uniform recomputes every layer (each layer
  // input is a checkpoint, whatever the block size), block the first N of each model chunk.
  if (args_.recompute_granularity == "full") {
    mo.recompute_layers = args_.recompute_method == "uniform"
                              ? static_cast<int>(args_.num_layers)
                              : static_cast<int>(args_.recompute_num_layers);
  }
  mo.recompute_attention = args_.recompute_granularity == "selective";
  // Data-parallel buckets, per model chunk: the bf16 model reduces (and gathers) its chunk's, the
  // optimizer owns a part of each of them with the distributed optimizer.
  std::vector<std::vector<DpBucket>> chunk_buckets;
  for (int v = 0; v < args_.virtual_pipeline_size(); ++v) {
    const auto [first, last] = layout_->StageLayers(g_.coords.pp, v);
    chunk_buckets.push_back(
        PlanDpBuckets(*params_, first, last, g_.coords.pp == 0 && v == 0,
                      g_.coords.pp == g_.sizes.pp - 1 && v == args_.virtual_pipeline_size() - 1,
                      static_cast<size_t>(args_.ddp_bucket_size)));
  }
  if (args_.bf16) {
#ifdef LEANTRON_HAVE_CUDA
    cuda::BF16Options bo;
    bo.model = mo;
    bo.loss_scale = 1.0f / static_cast<float>(args_.num_micro_batches());
    bo.recompute_gelu = args_.recompute_gelu;
    bo.dp = g_.dp.get();
    bo.overlap_grad_reduce = args_.overlap_grad_reduce;
    bo.distributed_optimizer = args_.use_distributed_optimizer;
    bo.overlap_param_gather = args_.overlap_param_gather;
    bo.grad_reduce_in_bf16 = args_.grad_reduce_in_bf16;
    bo.num_micro_batches = static_cast<int>(args_.num_micro_batches());
    bo.tp = g_.tp.get();
    bo.pp_rank = g_.coords.pp;
    for (int v = 0; v < args_.virtual_pipeline_size(); ++v) {
      bo.virtual_chunk = v;
      bo.dp_buckets = chunk_buckets[v];
      absl::StatusOr<std::unique_ptr<StageModel>> m =
          cuda::CreateBF16GptModel(*layout_, params_.get(), bo);
      if (!m.ok()) return m.status();
      models_.push_back(std::move(*m));
      chunks_.push_back(models_.back().get());
    }
#endif
  } else {
    for (int v = 0; v < args_.virtual_pipeline_size(); ++v) {
      models_.push_back(std::make_unique<ReferenceModel>(ops_.get(), *layout_, g_.tp.get(),
                                                         params_.get(), g_.coords.pp, v, mo));
      chunks_.push_back(models_.back().get());
    }
  }
  OptimizerOptions oo;
  oo.beta1 = static_cast<float>(args_.adam_beta1);
  oo.beta2 = static_cast<float>(args_.adam_beta2);
  oo.eps = static_cast<float>(args_.adam_eps);
  oo.weight_decay = static_cast<float>(args_.weight_decay);
  oo.clip_grad = static_cast<float>(args_.clip_grad);
  oo.distributed = args_.use_distributed_optimizer;
  for (const std::vector<DpBucket>& b : chunk_buckets)
    oo.buckets.insert(oo.buckets.end(), b.begin(), b.end());
  oo.dp_by_model = chunks_.front()->reduces_data_parallel();
  optimizer_ = std::make_unique<Optimizer>(ops_.get(), params_.get(), &g_, oo);

  DataOptions dopt;
  dopt.mock = args_.mock_data;
  dopt.data_path = args_.data_path;
  dopt.split = args_.split;
  dopt.seq_length = args_.seq_length;
  dopt.seed = args_.seed;
  dopt.train_iters = args_.train_iters;
  dopt.eval_interval = args_.eval_interval;
  dopt.eval_iters = args_.eval_iters;
  dopt.global_batch = args_.global_batch_size;
  dopt.vocab_size = config.vocab_size;
  dopt.cache_dir = args_.data_cache_path;
  {
    absl::StatusOr<std::unique_ptr<BatchSource>> d = BatchSource::Create(dopt);
    if (absl::Status s = Agree(*g_.world, d.status()); !s.ok()) return s;
    data_ = std::move(*d);
  }

  TrainPosition pos;
  if (!args_.load.empty()) {
    if (absl::Status s = LoadTrainingCheckpoint(args_, *layout_, g_, *params_, *optimizer_, &pos);
        !s.ok())
      return s;
    if (g_.world_rank == 0)
      Print(absl::StrFormat(" loaded checkpoint from %s at iteration %d\n", args_.load,
                            pos.iteration));
  }
  if (g_.world_rank == 0) {
    int64_t total = 0;
    for (const ckpt::ParamSpec& p : layout_->params())
      if (p.tied_to.empty()) total += ckpt::NumElements(p.shape);
    // An uneven split (--decoder-first/last-pipeline-num-layers) shows each stage's layers.
    std::string uneven;
    const ckpt::ParallelConfig& par = layout_->parallel();
    if (par.first_stage_layers > 0 || par.last_stage_layers > 0) {
      for (int s = 0; s < par.pp; ++s) {
        const auto [first, last] = layout_->StageLayers(s, 0);
        absl::StrAppend(&uneven, s == 0 ? " (layers per stage " : ", ", last - first);
      }
      uneven += ")";
    }
    Print(absl::StrFormat(
        "> building GPT model: %d layers, hidden %d, heads %d, ffn %d, padded vocab %d, %d "
        "parameters; TP %d PP %d%s (x%d virtual) DP %d%s%s; %d micro-batches per step\n",
        config.num_layers, config.hidden_size, config.num_attention_heads, config.ffn_hidden_size,
        layout_->padded_vocab_size(), total, g_.sizes.tp, g_.sizes.pp, uneven,
        args_.virtual_pipeline_size(), g_.sizes.dp, args_.sequence_parallel ? " +SP" : "",
        args_.use_distributed_optimizer ? " +distributed optimizer" : "",
        args_.num_micro_batches()));
  }

  if (!args_.tensorboard_dir.empty() && logging_rank()) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> tb =
        TensorBoardWriter::Create(args_.tensorboard_dir);
    if (!tb.ok()) return tb.status();
    tensorboard_ = std::move(*tb);
  }
  const int64_t start_iteration = pos.iteration;
  if (g_.world_rank == 0 && !args_.bf16 &&
      (args_.overlap_grad_reduce || args_.overlap_param_gather)) {
    Print(
        " note: --overlap-grad-reduce/--overlap-param-gather have no effect on the float32 model "
        "(same numbers, no overlap)\n");
  }
  if (g_.world_rank == 0 && args_.overlap_param_gather && !args_.use_distributed_optimizer) {
    Print(" note: --overlap-param-gather has no effect without --use-distributed-optimizer\n");
  }
  LrSchedule sched;
  sched.max_lr = args_.lr;
  sched.min_lr = args_.min_lr;
  sched.init_lr = args_.lr_warmup_init;
  sched.warmup_iters = args_.lr_warmup_iters;
  sched.decay_iters = args_.lr_decay_iters;
  sched.style = *ParseDecayStyle(args_.lr_decay_style);
  if (sched.style == DecayStyle::kWsd) {
    sched.wsd_decay_iters = args_.lr_wsd_decay_iters;
    sched.wsd_style = *ParseWsdDecayStyle(args_.lr_wsd_decay_style);
  }
  const double flops_per_iter = FlopsPerIteration(args_, layout_->padded_vocab_size());
  const bool has_valid = data_->has_split(data::SplitKind::kValid) && args_.eval_iters > 0;

  double interval_loss = 0.0, interval_ms = 0.0;
  int64_t interval_iters = 0, interval_loss_iters = 0, skipped = 0, nans = 0;
  bool memory_reported = false;
  std::vector<MicroBatch> mbs;
  while (pos.iteration < args_.train_iters) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s =
            GetMicroBatches(data::SplitKind::kTrain, pos.consumed_train_samples, true, &mbs);
        !s.ok())
      return s;
    optimizer_->ZeroGrad();
    double loss[1] = {RunSchedule(chunks_, *g_.pp, mbs, false) / static_cast<double>(mbs.size())};
    optimizer_->FinalizeGrads();
    const float lr = static_cast<float>(sched.At(pos.iteration));
    const StepResult step = optimizer_->Step(lr);
    g_.dp->AllReduceSumDouble(loss, 1);
    loss[0] /= g_.sizes.dp;
    ++pos.iteration;
    pos.consumed_train_samples += args_.global_batch_size;
    const double iteration_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    interval_ms += iteration_ms;
    train_seconds_ += iteration_ms / 1000.0;
#ifdef LEANTRON_HAVE_CUDA
    if (NcclCommunicator* pp = args_.backend == "cuda" ? AsNccl(g_.pp.get()) : nullptr) {
      const double wait = pp->TakeRecvWaitMs();
      if (pos.iteration - start_iteration > 1) pipeline_wait_ms_ += wait;
    }
#endif
    if (pos.iteration - start_iteration > 1) {
      steady_ms_ += iteration_ms;
      ++steady_iters_;
    }
    ++interval_iters;
    if (step.skipped) ++skipped;
    if (!std::isfinite(loss[0])) {
      ++nans;
    } else if (!step.skipped) {
      interval_loss += loss[0];
      ++interval_loss_iters;
    }

    if (tensorboard_ && pos.iteration % args_.tensorboard_log_interval == 0) {
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tensorboard_->AddScalar("learning-rate", lr, pos.iteration);
      tensorboard_->AddScalar("batch-size", static_cast<double>(args_.global_batch_size),
                              pos.iteration);
      if (std::isfinite(loss[0])) tensorboard_->AddScalar("lm loss", loss[0], pos.iteration);
      tensorboard_->AddScalar("loss-scale", 1.0, pos.iteration);
      tensorboard_->AddScalar("grad-norm", step.grad_norm, pos.iteration);
      tensorboard_->AddScalar("iteration-time", secs, pos.iteration);
    }
    if (pos.iteration % args_.log_interval == 0 && logging_rank()) {
      const double ms = interval_ms / interval_iters;
      std::string line = absl::StrFormat(
          "[%s] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): "
          "%.1f |",
          Timestamp(), pos.iteration, args_.train_iters, pos.consumed_train_samples, ms);
      if (args_.log_throughput) {
        const double secs = ms / 1000.0;
        absl::StrAppendFormat(
            &line, " throughput per GPU (TFLOP/s/GPU): %.1f | tokens per second per GPU: %.1f |",
            flops_per_iter / (secs * g_.sizes.world() * 1e12),
            static_cast<double>(args_.global_batch_size * args_.seq_length) /
                (secs * g_.sizes.world()));
      }
      absl::StrAppendFormat(&line,
                            " learning rate: %E | global batch size: %5d | lm loss: %E | loss "
                            "scale: %.1f | grad norm: %.3f | number of skipped iterations: %3d | "
                            "number of nan iterations: %3d |\n",
                            sched.At(pos.iteration), args_.global_batch_size,
                            interval_loss_iters > 0 ? interval_loss / interval_loss_iters : 0.0,
                            1.0, step.grad_norm, skipped, nans);
      Print(line);
      if (!memory_reported) {
        std::string gpu;
#ifdef LEANTRON_HAVE_CUDA
        if (args_.backend == "cuda") {
          int64_t acts = 0;
          for (const StageModel* m : chunks_) acts += m->activation_bytes();
          gpu = absl::StrFormat(
              " GPU in use: %d | of which parameters %d, gradients %d, Adam state %d, bf16 "
              "weights, activations and workspaces %d |",
              cuda::DeviceMemoryInUse() >> 20, params_->size() * 4 >> 20, params_->size() * 4 >> 20,
              optimizer_->state_elements() * 8 >> 20, acts >> 20);
        }
#endif
        Print(
            absl::StrFormat("[Rank %d] (after %d iterations) memory (MB) | max resident: %d |%s\n",
                            g_.world_rank, pos.iteration, PeakResidentMiB(), gpu));
        memory_reported = true;
      }
    }
    if (pos.iteration % args_.log_interval == 0) {
      interval_loss = interval_ms = 0.0;
      interval_iters = interval_loss_iters = skipped = nans = 0;
    }
    if (has_valid && pos.iteration % args_.eval_interval == 0) {
      if (absl::Status s = Evaluate(pos.iteration, pos.iteration / args_.eval_interval - 1);
          !s.ok())
        return s;
    }
    if (args_.save_interval > 0 && pos.iteration % args_.save_interval == 0) {
      if (absl::Status s = Save(pos); !s.ok()) return s;
    }
    float stop[1] = {g_stop_requested ? 1.0f : 0.0f};
    g_.world->AllReduceMax(stop, 1);
    const bool exit_now = args_.exit_interval > 0 && pos.iteration % args_.exit_interval == 0;
    if (stop[0] > 0.0f || exit_now) {
      if (g_.world_rank == 0)
        Print(absl::StrFormat(" exiting %s at iteration %d\n",
                              exit_now ? "at --exit-interval" : "on signal", pos.iteration));
      break;
    }
  }
  // Save at the end (or on a stop) unless this iteration was just saved.
  if (!args_.save.empty() &&
      !(args_.save_interval > 0 && pos.iteration % args_.save_interval == 0)) {
    if (absl::Status s = Save(pos); !s.ok()) return s;
  }
  ReportRank(pos.iteration - start_iteration);
  return absl::OkStatus();
}

}  // namespace

void InstallStopSignalHandler() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

double FlopsPerIteration(const TrainArgs& a, int64_t padded_vocab) {
  const double h = a.hidden_size, L = a.num_layers, s = a.seq_length, ffn = a.ffn_hidden_size;
  const double per_token =
      L * (3 * 2 * (h * (h + 2 * h) + h * h) + 3 * 2 * 2 * h * ffn + 3 * 2 * h * s) +
      3 * 2 * h * static_cast<double>(padded_vocab);
  return per_token * static_cast<double>(a.global_batch_size) * s;
}

absl::Status RunTraining(const TrainArgs& args, const LaunchInfo& launch) {
  ParallelSizes sizes;
  sizes.tp = args.tensor_model_parallel_size;
  sizes.cp = args.context_parallel_size;
  sizes.pp = args.pipeline_model_parallel_size;
  sizes.dp = args.data_parallel_size();
  DistOptions dist;
  dist.timeout_s = static_cast<int>(std::ceil(args.distributed_timeout_minutes * 60));
  dist.rendezvous_timeout_s = args.rendezvous_timeout_seconds;
  dist.heartbeat_timeout_s = args.heartbeat_timeout_seconds;
#ifdef LEANTRON_HAVE_CUDA
  // GPUs talk through NCCL (device memory, ordered on the compute stream), CPUs through Gloo.
  absl::StatusOr<ProcessGroups> groups = args.backend == "cuda"
                                             ? CreateNcclProcessGroups(launch, sizes, dist)
                                             : CreateProcessGroups(launch, sizes, dist);
#else
  absl::StatusOr<ProcessGroups> groups = CreateProcessGroups(launch, sizes, dist);
#endif
  if (!groups.ok()) return groups.status();
  Trainer trainer(args, *groups);
  return trainer.Run();
}

}  // namespace leantron::trainer
