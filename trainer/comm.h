// Communicators per process group and Megatron's rank order. Parallel code talks only to
// `Communicator`; `gloo` (TCP, one process per rank) is the CPU backend, NCCL will be another.
// Pointers are backend memory (host for gloo).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace leantron::trainer {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank ends with the same result (ring order is fixed, so results are bitwise equal).
  virtual void AllReduceSum(float* data, size_t n) = 0;
  virtual void AllReduceMax(float* data, size_t n) = 0;
  virtual void AllReduceSumDouble(double* data, size_t n) = 0;
  // AllReduceSum of several arrays in one call, which a backend may launch as one operation.
  virtual void AllReduceSumMany(const std::vector<std::pair<float*, size_t>>& arrays) {
    for (const auto& [data, n] : arrays) AllReduceSum(data, n);
  }
  // out[size·n] = every rank's in[n], in rank order.
  virtual void AllGather(const float* in, float* out, size_t n) = 0;
  // out[n] = rank's block of Σ in[size·n].
  virtual void ReduceScatter(const float* in, float* out, size_t n) = 0;
  virtual void Broadcast(float* data, size_t n, int root) = 0;
  // Point-to-point for pipeline schedules: messages of one tag between two ranks arrive in the
  // order they were sent. SendAsync copies `data` and returns at once; WaitSends waits for all.
  virtual void SendAsync(const float* data, size_t n, int peer, uint32_t tag) = 0;
  virtual void Recv(float* data, size_t n, int peer, uint32_t tag) = 0;
  virtual void WaitSends() = 0;
  virtual void Barrier() = 0;
};

// A group of one: every collective is the identity.
std::unique_ptr<Communicator> MakeSelfCommunicator();

// Wraps `inner`, adding the wall time spent in each call to `*seconds` (the trainer's report of
// how much of a step goes to communication).
std::unique_ptr<Communicator> MakeTimedCommunicator(std::unique_ptr<Communicator> inner,
                                                    double* seconds);

// Where this process sits: world rank = tp + TP·(cp + CP·(dp + DP·pp)) (CP = 1 here).
struct RankCoords {
  int tp = 0, dp = 0, pp = 0;
};
struct ParallelSizes {
  int tp = 1, pp = 1, dp = 1;
  int world() const { return tp * pp * dp; }
};
RankCoords CoordsOf(int world_rank, const ParallelSizes& sizes);
int WorldRankOf(const RankCoords& c, const ParallelSizes& sizes);

// The world ranks of the groups a rank at `c` belongs to, in group-rank order: everyone; its
// tensor-, data- and pipeline-parallel groups; its model (TP x PP) group; and with PP > 1 the
// first and last stage of its pipeline (the tied embedding's group; the rank may not be in it).
struct GroupMembers {
  std::vector<int> world, tp, dp, pp, model, embedding;
};
GroupMembers MembersOf(const RankCoords& c, const ParallelSizes& sizes);

struct ProcessGroups {
  ParallelSizes sizes;
  RankCoords coords;
  int world_rank = 0;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tp;  // same dp, pp
  std::unique_ptr<Communicator> dp;  // same tp, pp
  std::unique_ptr<Communicator> pp;  // same tp, dp
  // Tensor × pipeline ranks of one model replica: the gradient norm is summed over it.
  std::unique_ptr<Communicator> model;
  // First and last pipeline stage of one (tp, dp): keeps the tied embedding copies equal. Null when
  // PP = 1 or this rank is on neither stage.
  std::unique_ptr<Communicator> embedding;
};

// Groups of a one-process run: every communicator is the process itself.
ProcessGroups SingleProcessGroups();

// How this process finds the others: read from the launcher's environment.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string rendezvous_dir;  // shared directory for Gloo's file store
  // What every rank of the job presents to the rendezvous store, so that no other process can
  // join: LEANTRON_JOB_TOKEN (train --nproc-per-node sets a random one; set it in a cluster job
  // script to a secret), else the launcher's job identity (torchrun's run id, Slurm's job and step,
  // Open MPI's job id), which keeps two jobs on one port apart but is no secret.
  std::string job_token;
};
// RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, else SLURM_PROCID/SLURM_NTASKS/
// SLURM_LOCALID, else OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK; a single process otherwise.
LaunchInfo LaunchInfoFromEnvironment();

// Connects the world and every group this rank belongs to (Gloo over TCP, rendezvous through a
// file store in `launch.rendezvous_dir`). World size 1 needs no rendezvous.
absl::StatusOr<ProcessGroups> CreateProcessGroups(const LaunchInfo& launch,
                                                  const ParallelSizes& sizes);

}  // namespace leantron::trainer
