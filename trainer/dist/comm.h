// What parallel code talks to: a communicator per process group (trainer/dist/process_groups.h
// says which). Two backends: Gloo (comm_gloo.h: TCP, host memory, the CPU reference) and NCCL
// (nccl_comm.h: device memory, GPUs). Pointers are backend memory. Also how a process learns
// where it sits from its launcher.
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
  // in[size·n]: block p goes to rank p; out[size·n]: block p came from rank p (in != out).
  virtual void AllToAll(const float* in, float* out, size_t n) = 0;
  virtual void Broadcast(float* data, size_t n, int root) = 0;
  // 16-bit elements (bf16 weights) moved as they are.
  virtual void Broadcast16(uint16_t* data, size_t n, int root) = 0;
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

// How long the communication layer waits before it gives up with one clear line instead of
// hanging (the trainer's flags set them).
struct DistOptions {
  int timeout_s = 600;             // an operation that makes no progress (Megatron: 10 minutes)
  int rendezvous_timeout_s = 300;  // reaching the store, seeing every rank, creating communicators
  int heartbeat_timeout_s = 20;    // silence after which a peer counts as dead (NCCL backend)
};

// How this process finds the others: read from the launcher's environment.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks of the job on this node (they share its cores)
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string rendezvous_dir;  // shared directory for Gloo's file store
  // What every rank of the job presents to the rendezvous store, so that no other process can
  // join: LEANTRON_JOB_TOKEN (train --nproc-per-node sets a random one; set it in a cluster job
  // script to a secret), else the launcher's job identity (torchrun's run id, Slurm's job and step,
  // Open MPI's job id), which keeps two jobs on one port apart but is no secret.
  std::string job_token;
  // The address Gloo's connections bind to (LEANTRON_GLOO_HOSTNAME); empty: 127.0.0.1 when
  // MASTER_ADDR is local, else the host name.
  std::string gloo_hostname;
};
// RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT, else SLURM_PROCID/
// SLURM_NTASKS/SLURM_LOCALID/SLURM_NTASKS_PER_NODE, else OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/
// _LOCAL_SIZE; a single process otherwise.
LaunchInfo LaunchInfoFromEnvironment();

}  // namespace leantron::trainer
