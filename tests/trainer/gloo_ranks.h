// In-process Gloo ranks for the trainer's unit tests (one std::thread per rank).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "trainer/dist/comm_gloo.h"
#include "trainer/dist/process_groups.h"

namespace leantron::trainer {

// Rank `rank` of two in-process Gloo ranks forming one data-parallel group (rendezvous in `dir`).
inline absl::StatusOr<ProcessGroups> DataParallelRank(const std::string& dir, int rank) {
  LaunchInfo launch;
  launch.rank = rank;
  launch.world_size = 2;
  launch.rendezvous_dir = dir;
  return CreateProcessGroups(launch, {.dp = 2});
}

}  // namespace leantron::trainer
