// The training loop of one rank: build process groups, model, optimizer and data; load; run
// iterations (schedule, gradient reduction, clipping, AdamW, learning-rate schedule); log in
// Megatron's format; evaluate; save; stop cleanly on SIGTERM.
#pragma once

#include "absl/status/status.h"
#include "trainer/core/args.h"
#include "trainer/dist/comm.h"

namespace leantron::trainer {

// Installs the SIGTERM/SIGINT handler that makes the loop save (when --save is set) and exit.
void InstallStopSignalHandler();

absl::Status RunTraining(const TrainArgs& args, const LaunchInfo& launch);

// Megatron's model FLOPs per iteration (../shared/specs/trainer.md), forward and backward, with
// grouped-query attention (query groups, kv_channels) and SwiGLU counted as Megatron counts them.
// `args` validated (num_query_groups and kv_channels filled in).
double FlopsPerIteration(const TrainArgs& args, int64_t padded_vocab);

}  // namespace leantron::trainer
