// --save / --load through libckpt: every (tp, pp) rank of data-parallel rank 0 writes its shard
// (parameters, fp32 main weights, Adam moments) and world rank 0 commits the iteration atomically;
// loading pulls full tensors of any saved TP/PP layout and keeps this rank's shard, from the
// project's checkpoints or Megatron-LM's (torch, torch_dist: libckpt/checkpoint_source.h). The
// training position is the iteration and consumed samples; learning rate and dropout masks are
// functions of those, so nothing else is needed for an exact resume.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "libckpt/layout.h"
#include "trainer/core/args.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/core/stage_model.h"
#include "trainer/dist/process_groups.h"

namespace leantron::trainer {

struct TrainPosition {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  // The HF class the loaded checkpoint came from (Mistral trains as Llama does), written into the
  // checkpoints this run saves so that `convert_hf --to-hf` gives the same class back.
  ckpt::HfArchitecture hf_architecture = ckpt::HfArchitecture::kUnset;
  // Set by a load: whether the FP8 scaling state came from the checkpoint (--fp8-format runs;
  // a checkpoint without it, or of another recipe or layout, leaves the scaling fresh).
  bool fp8_state_loaded = false;
};

// Collective over the world. With --fp8-format each (tp, pp) shard also keeps its chunks' FP8
// scaling state (fp8_state.safetensors, beside the shard's tensors).
absl::Status SaveTrainingCheckpoint(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                    ProcessGroups& groups, ParamStore& params, Optimizer& optimizer,
                                    const std::vector<StageModel*>& chunks,
                                    const TrainPosition& position);

// Loads args.load into params (and optimizer and position unless --finetune / --no-load-optim),
// and the FP8 scaling state when the checkpoint has it for this recipe and layout.
absl::Status LoadTrainingCheckpoint(const TrainArgs& args, const ckpt::ModelLayout& layout,
                                    ProcessGroups& groups, ParamStore& params, Optimizer& optimizer,
                                    const std::vector<StageModel*>& chunks,
                                    TrainPosition* position);

}  // namespace leantron::trainer
