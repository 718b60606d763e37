// --save / --load through libckpt: every (tp, pp) rank of data-parallel rank 0 writes its shard
// (parameters, fp32 main weights, Adam moments) and world rank 0 commits the iteration atomically;
// loading pulls full tensors of any saved TP/PP layout and keeps this rank's shard. The training
// position is the iteration and consumed samples; learning rate and dropout masks are functions of
// those, so nothing else is needed for an exact resume.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "libckpt/layout.h"
#include "trainer/core/args.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/dist/process_groups.h"

namespace leantron::trainer {

struct TrainPosition {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  // The HF class the loaded checkpoint came from (Mistral trains as Llama does), written into the
  // checkpoints this run saves so that `convert_hf --to-hf` gives the same class back.
  ckpt::HfArchitecture hf_architecture = ckpt::HfArchitecture::kUnset;
};

// Collective over the world.
absl::Status SaveTrainingCheckpoint(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                    ProcessGroups& groups, ParamStore& params, Optimizer& optimizer,
                                    const TrainPosition& position);

// Loads args.load into params (and optimizer and position unless --finetune / --no-load-optim).
absl::Status LoadTrainingCheckpoint(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                    ProcessGroups& groups, ParamStore& params, Optimizer& optimizer,
                                    TrainPosition* position);

}  // namespace leantron::trainer
