// Megatron's process groups: where a rank sits in the tensor × context × expert × data × pipeline
// grid (Megatron-Core's rank order tp-cp-ep-dp-pp: tensor-parallel ranks are neighbours), which
// ranks share each group, and the communicators a rank holds for them. One list of groups
// (GroupsOf) serves both backends, so Gloo and NCCL build the same groups in the same order.
// Expert parallelism is a dimension of the grid of size one for now.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trainer/dist/comm.h"

namespace leantron::trainer {

// world rank = tp + TP·(cp + CP·(ep + EP·(dp + DP·pp))).
struct RankCoords {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
};
struct ParallelSizes {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;
  int world() const { return tp * cp * ep * dp * pp; }
};
RankCoords CoordsOf(int world_rank, const ParallelSizes& sizes);
int WorldRankOf(const RankCoords& c, const ParallelSizes& sizes);

struct ProcessGroups {
  ParallelSizes sizes;
  RankCoords coords;
  int world_rank = 0;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;  // same cp, dp, pp
  std::unique_ptr<Communicator> cp;  // same tp, dp, pp: one sequence's chunks
  std::unique_ptr<Communicator> dp;  // same tp, cp, pp
  std::unique_ptr<Communicator> pp;  // same tp, cp, dp
  // Data × context parallel ranks (same tp, pp; rank cp + CP·dp), Megatron's data-parallel group
  // with context parallel: the model is replicated over it, gradients are summed over it and
  // the distributed optimizer shards over it. Made only when CP > 1 (dp is it otherwise).
  std::unique_ptr<Communicator> dp_cp;
  // Tensor × pipeline ranks of one model replica: the gradient norm is summed over it.
  std::unique_ptr<Communicator> model;
  // First and last pipeline stage of one (tp, cp, dp): keeps the tied embedding copies equal. Null
  // when PP = 1 or this rank is on neither stage.
  std::unique_ptr<Communicator> embedding;

  // Megatron's get_data_parallel_group(with_context_parallel=True).
  Communicator& data_parallel_with_cp() const { return dp_cp ? *dp_cp : *dp; }
};

// One group a rank belongs to: a key naming it (the same on every member, unique in the job), its
// members as world ranks in group-rank order, and the ProcessGroups member that holds it.
struct GroupSpec {
  std::string key;
  std::vector<int> members;
  std::unique_ptr<Communicator> ProcessGroups::*slot;
};
// The groups of the rank at `c`, in the order every backend creates them: world, tp, cp, dp, pp,
// model, with CP > 1 dp_cp and, with PP > 1 on the first or last stage, embedding.
std::vector<GroupSpec> GroupsOf(const RankCoords& c, const ParallelSizes& sizes);

// Groups of a one-process run: every communicator is the process itself.
ProcessGroups SingleProcessGroups();

}  // namespace leantron::trainer
