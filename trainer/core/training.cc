#include "trainer/core/training.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libckpt/layout.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/data.h"
#include "trainer/core/model_builder.h"
#include "trainer/core/pipeline.h"
#include "trainer/core/run_report.h"
#include "trainer/core/scheduler.h"
#include "trainer/core/tensorboard.h"
#include "trainer/dist/comm_gloo.h"
#ifdef LEANTRON_HAVE_CUDA
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
  Trainer(const TrainArgs& args, ProcessGroups& groups, int local_ranks)
      : args_(args), g_(groups), local_ranks_(local_ranks) {}

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

  // Everything before the first iteration: the model, the data, a checkpoint, the banner.
  absl::Status Setup(TrainPosition* pos);
  // One iteration's Megatron log line (and the memory line after the first).
  void LogIteration(const TrainPosition& pos, double lr_now, double ms, double loss,
                    const StepResult& step, int64_t skipped, int64_t nans);

  const TrainArgs& args_;
  ProcessGroups& g_;
  int local_ranks_;  // the job's ranks on this node
  TrainingModel m_;
  std::unique_ptr<BatchSource> data_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // logging rank only
  RunTimes times_;
  bool memory_reported_ = false;
};

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
    loss_sum += RunSchedule(m_.chunks, *g_.pp, mbs, /*forward_only=*/true);
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
  absl::Status s =
      SaveTrainingCheckpoint(args_, *m_.layout, g_, *m_.params, *m_.optimizer, m_.chunks, position);
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

absl::Status Trainer::Setup(TrainPosition* pos) {
  // Host-side timing of Gloo calls; NCCL calls only enqueue work, so the cuda backend measures
  // its communication on the GPU instead.
  if (args_.backend != "cuda") {
    // Context parallelism's own share too (its attention's exchanges and the loss sum).
    g_.cp = MakeTimedCommunicator(std::move(g_.cp), &times_.cp_comm_seconds);
  }
  for (std::unique_ptr<Communicator>* c :
       {&g_.world, &g_.tp, &g_.cp, &g_.dp, &g_.pp, &g_.model, &g_.dp_cp, &g_.embedding}) {
    if (*c && args_.backend != "cuda") {
      *c = MakeTimedCommunicator(std::move(*c), &times_.comm_seconds);
    }
  }
  absl::StatusOr<TrainingModel> m = BuildTrainingModel(args_, g_, local_ranks_);
  if (!m.ok()) return m.status();
  m_ = std::move(*m);

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
  dopt.vocab_size = m_.layout->config().vocab_size;
  dopt.cache_dir = args_.data_cache_path;
  dopt.reset_position_ids = args_.reset_position_ids;
  dopt.reset_attention_mask = args_.reset_attention_mask;
  dopt.eod_mask_loss = args_.eod_mask_loss;
  dopt.eod = args_.eod_id;
  dopt.cp_rank = g_.coords.cp;
  dopt.cp_size = g_.sizes.cp;
  {
    absl::StatusOr<std::unique_ptr<BatchSource>> d = BatchSource::Create(dopt);
    if (absl::Status s = Agree(*g_.world, d.status()); !s.ok()) return s;
    data_ = std::move(*d);
  }

  if (!args_.load.empty()) {
    if (absl::Status s = LoadTrainingCheckpoint(args_, *m_.layout, g_, *m_.params, *m_.optimizer,
                                                m_.chunks, pos);
        !s.ok())
      return s;
    if (g_.world_rank == 0)
      Print(absl::StrFormat(" loaded checkpoint from %s at iteration %d\n", args_.load,
                            pos->iteration));
    if (g_.world_rank == 0 && !args_.fp8_format.empty() && !pos->fp8_state_loaded)
      Print(
          " FP8 scaling starts fresh: the checkpoint has no FP8 state of this recipe and layout\n");
  }
  if (g_.world_rank == 0) Print(ModelBanner(args_, m_, g_));
  if (!args_.tensorboard_dir.empty() && logging_rank()) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> tb =
        TensorBoardWriter::Create(args_.tensorboard_dir);
    if (!tb.ok()) return tb.status();
    tensorboard_ = std::move(*tb);
  }
  if (g_.world_rank == 0 && !args_.bf16 &&
      (args_.overlap_grad_reduce || args_.overlap_param_gather)) {
    Print(
        " note: --overlap-grad-reduce/--overlap-param-gather have no effect on the float32 model "
        "(same numbers, no overlap)\n");
  }
  if (g_.world_rank == 0 && args_.overlap_param_gather && !args_.use_distributed_optimizer) {
    Print(" note: --overlap-param-gather has no effect without --use-distributed-optimizer\n");
  }
  return absl::OkStatus();
}

void Trainer::LogIteration(const TrainPosition& pos, double lr_now, double ms, double loss,
                           const StepResult& step, int64_t skipped, int64_t nans) {
  if (!logging_rank()) return;
  std::string line = absl::StrFormat(
      "[%s] iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): "
      "%.1f |",
      Timestamp(), pos.iteration, args_.train_iters, pos.consumed_train_samples, ms);
  if (args_.log_throughput) {
    const double secs = ms / 1000.0;
    absl::StrAppendFormat(
        &line, " throughput per GPU (TFLOP/s/GPU): %.1f | tokens per second per GPU: %.1f |",
        FlopsPerIteration(args_, m_.layout->padded_vocab_size()) / (secs * g_.sizes.world() * 1e12),
        static_cast<double>(args_.global_batch_size * args_.seq_length) /
            (secs * g_.sizes.world()));
  }
  absl::StrAppendFormat(&line,
                        " learning rate: %E | global batch size: %5d | lm loss: %E | loss "
                        "scale: %.1f | grad norm: %.3f | number of skipped iterations: %3d | "
                        "number of nan iterations: %3d |\n",
                        lr_now, args_.global_batch_size, loss, 1.0, step.grad_norm, skipped, nans);
  Print(line);
  if (!memory_reported_) {
    Print(MemoryLine(args_, m_, g_, pos.iteration));
    memory_reported_ = true;
  }
}

absl::Status Trainer::Run() {
  TrainPosition pos;
  if (absl::Status s = Setup(&pos); !s.ok()) return s;
  const int64_t start_iteration = pos.iteration;
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
  const bool has_valid = data_->has_split(data::SplitKind::kValid) && args_.eval_iters > 0;
  Optimizer& optimizer = *m_.optimizer;

  double interval_loss = 0.0, interval_ms = 0.0;
  int64_t interval_iters = 0, interval_loss_iters = 0, skipped = 0, nans = 0;
  std::vector<MicroBatch> mbs;
  while (pos.iteration < args_.train_iters) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s =
            GetMicroBatches(data::SplitKind::kTrain, pos.consumed_train_samples, true, &mbs);
        !s.ok())
      return s;
    optimizer.ZeroGrad();
    double loss[1] = {RunSchedule(m_.chunks, *g_.pp, mbs, false) / static_cast<double>(mbs.size())};
    optimizer.FinalizeGrads();
    const float lr = static_cast<float>(sched.At(pos.iteration));
    const StepResult step = optimizer.Step(lr);
    g_.dp->AllReduceSumDouble(loss, 1);
    loss[0] /= g_.sizes.dp;
    ++pos.iteration;
    pos.consumed_train_samples += args_.global_batch_size;
    const double iteration_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    interval_ms += iteration_ms;
    times_.train_seconds += iteration_ms / 1000.0;
#ifdef LEANTRON_HAVE_CUDA
    if (NcclCommunicator* pp = args_.backend == "cuda" ? AsNccl(g_.pp.get()) : nullptr) {
      const double wait = pp->TakeRecvWaitMs();
      if (pos.iteration - start_iteration > 1) times_.pipeline_wait_ms += wait;
    }
#endif
    if (pos.iteration - start_iteration > 1) {
      times_.steady_ms += iteration_ms;
      ++times_.steady_iters;
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
    if (pos.iteration % args_.log_interval == 0) {
      LogIteration(pos, sched.At(pos.iteration), interval_ms / interval_iters,
                   interval_loss_iters > 0 ? interval_loss / interval_loss_iters : 0.0, step,
                   skipped, nans);
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
  times_.iterations = pos.iteration - start_iteration;
  Print(RankReport(args_, m_, g_, times_));
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
  // Megatron's num_floating_point_operations for a dense GPT: every product three times (forward,
  // data and weight gradients) at two FLOPs per multiply-add. Query width heads·kv_channels, key
  // and value widths query_groups·kv_channels (grouped-query attention); SwiGLU's fc1 is twice as
  // wide ([gate; up]). The logits are counted once, tied or untied, as Megatron counts them.
  const double h = a.hidden_size, s = a.seq_length, ffn = a.ffn_hidden_size;
  const double q = static_cast<double>(a.kv_channels) * a.num_attention_heads;
  const double kv = static_cast<double>(a.kv_channels) * a.num_query_groups;
  const double mlp_products = a.swiglu ? 3 : 2;
  const double layer = h * (q + 2 * kv) + q * h  // QKV and output projections
                       + mlp_products * h * ffn  // fc1 and fc2
                       + q * s;                  // causal QK^T and (QK^T)V: half of 2·q·s
  const double per_token = 3 * 2 * (a.num_layers * layer + h * static_cast<double>(padded_vocab));
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
  Trainer trainer(args, *groups, launch.local_world_size);
  return trainer.Run();
}

}  // namespace leantron::trainer
