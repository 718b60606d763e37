// What one rank trains, built from the arguments: the parallel layout, the parameters (initialised
// as Megatron does), this pipeline stage's model chunks — the float32 ReferenceModel over `Ops`,
// or on GPUs with --bf16 the bf16 model — the components that listen to the chunks (the data-
// parallel gradient reducer on GPUs) and the optimizer over the same buckets.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "libckpt/layout.h"
#include "trainer/core/args.h"
#include "trainer/core/model_events.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/core/stage_model.h"
#include "trainer/dist/process_groups.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

struct TrainingModel {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<ckpt::ModelLayout> layout;
  std::unique_ptr<ParamStore> params;
  std::vector<std::unique_ptr<StageModel>> models;  // this stage's model chunks, virtual order
  std::vector<StageModel*> chunks;                  // the same, as the schedule takes them
  std::vector<std::unique_ptr<ModelEvents>> listeners;
  std::unique_ptr<Optimizer> optimizer;
};

// `local_ranks`: the job's ranks on this node, which share its cores (the offloaded optimizer's
// host threads).
absl::StatusOr<TrainingModel> BuildTrainingModel(const TrainArgs& args, ProcessGroups& groups,
                                                 int local_ranks = 1);

}  // namespace leantron::trainer
