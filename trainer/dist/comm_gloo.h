// The Gloo backend of Communicator (TCP between processes, host memory): the CPU reference path's
// process groups, so the same parallel code runs multi-process on machines without GPUs.
#pragma once

#include "absl/status/statusor.h"
#include "trainer/dist/comm.h"
#include "trainer/dist/process_groups.h"

namespace leantron::trainer {

// Connects the world and every group this rank belongs to (Gloo over TCP, rendezvous through a
// file store in `launch.rendezvous_dir`, or rank 0's TCP store). World size 1 needs no rendezvous.
// An operation waits at most options.timeout_s.
absl::StatusOr<ProcessGroups> CreateProcessGroups(const LaunchInfo& launch,
                                                  const ParallelSizes& sizes,
                                                  const DistOptions& options = {});

}  // namespace leantron::trainer
