// What the training loop prints besides Megatron's iteration line: the model banner at the start,
// the memory line after the first logged iteration, and each rank's end-of-run report (where it
// sits, what it holds, where its step time went, what its listeners did).
#pragma once

#include <cstdint>
#include <string>

#include "trainer/core/args.h"
#include "trainer/core/model_builder.h"
#include "trainer/dist/process_groups.h"

namespace leantron::trainer {

// "> building GPT model: ..." (rank 0).
std::string ModelBanner(const TrainArgs& args, const TrainingModel& m, const ProcessGroups& g);

// "[Rank r] (after N iterations) memory (MB) | ..." once training has run a while.
std::string MemoryLine(const TrainArgs& args, const TrainingModel& m, const ProcessGroups& g,
                       int64_t iteration);

// Timings the loop gathered for the report.
struct RunTimes {
  int64_t iterations = 0;
  double train_seconds = 0.0;    // in training iterations
  double comm_seconds = 0.0;     // inside a (host-timed, Gloo) communicator
  double cp_comm_seconds = 0.0;  // of which inside the context-parallel group's
  // After the first iteration (warm-up): wall time and the GPU's waits for pipeline data.
  double steady_ms = 0.0, pipeline_wait_ms = 0.0;
  int64_t steady_iters = 0;
};

// The end-of-run lines of this rank.
std::string RankReport(const TrainArgs& args, const TrainingModel& m, const ProcessGroups& g,
                       const RunTimes& t);

// Peak resident memory of this process (VmHWM), MiB.
int64_t PeakResidentMiB();

}  // namespace leantron::trainer
