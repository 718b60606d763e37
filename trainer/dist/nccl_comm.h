// The NCCL backend of Communicator: one NCCL communicator per process group, device memory, work
// enqueued on a CUDA stream (cuda::MainStream() for the Communicator interface) so communication
// orders with the compute without host synchronisation.
//
// Rendezvous: rank 0 serves a TcpStore on MASTER_ADDR:MASTER_PORT; every rank connects, the lowest
// rank of each group publishes the group's ncclUniqueId under a key naming the group, and the
// communicators are created non-blocking (ncclCommInitRankConfig, blocking = 0) so a stuck init
// times out instead of hanging.
//
// No hangs when a rank dies: a watchdog per process publishes a heartbeat (store key hb/<rank>)
// every second, watches its ring neighbours' heartbeats and a shared "abort" key, polls
// ncclCommGetAsyncError on every communicator and times out operations that make no progress. On a
// dead peer, an NCCL error, a stuck operation or a store that stops answering it prints one line
// ("leantron: rank 3 lost rank 1 (no heartbeat for 20 s); exiting"), publishes
// the reason for the other ranks and _exit(1)s (exiting releases its NCCL communicators).
//
// Point-to-point follows Gloo's semantics (the pipeline schedules rely on them): SendAsync copies
// the data and never blocks the sender's stream; Recv makes the stream wait for the data. Each
// ordered pair of ranks gets its own two-rank NCCL communicator and internal stream, so a send
// waiting for its receiver holds up nothing else. Messages between two ranks arrive in the order
// they were sent, whatever their tags (NCCL has no tags): the receiver must receive in the
// sender's order, which pipeline.cc's schedules do. The pairs of pipeline-ring neighbours are
// connected at setup; any other pair is connected at its first message, which blocks the host
// until the peer makes its first call to this rank too. A device-wide wait (cudaDeviceSynchronize,
// cudaFree) also waits for sends nobody has received yet: keep them out of the schedules.
//
// Timeouts come from DistOptions (the trainer's --distributed-timeout-minutes,
// --rendezvous-timeout-seconds, --heartbeat-timeout-seconds). NCCL_* variables (NCCL_NVLS_ENABLE,
// NCCL_SOCKET_IFNAME, ...) are NCCL's own and left as the environment sets them.
//
// The implementation: nccl_runtime.h (internal), nccl_rendezvous.cc, nccl_watchdog.cc,
// nccl_comm.cc, nccl_groups.cc.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/dist/comm.h"
#include "trainer/dist/process_groups.h"

namespace leantron::trainer {

enum class CommType { kF32, kBF16, kF64 };
enum class ReduceOp { kSum, kMax };

class NcclRuntime;   // per-process state: store, watchdog, every NCCL communicator
struct NcclChannel;  // one direction of point-to-point between two ranks

// A process group over NCCL. Pointers of the Communicator interface may be device memory (the
// operation is enqueued on MainStream() and the call returns at once) or host memory (staged
// through the device; the call then waits for the result, as the trainer's host flags and loss
// sums need). The typed entry points take device memory only and an explicit stream.
//
// A group of one has no NCCL communicator (comm() is null): reductions are the identity and
// gathers copy on the stream. Use from one thread.
class NcclCommunicator final : public Communicator {
 public:
  // `members`: world ranks in group-rank order; `rank`: this process's index in it; `comm`: null
  // for a group of one.
  NcclCommunicator(std::shared_ptr<NcclRuntime> runtime, std::string name, std::vector<int> members,
                   int rank, ncclComm_t comm);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }

  void AllReduceSum(float* data, size_t n) override;
  void AllReduceMax(float* data, size_t n) override;
  void AllReduceSumDouble(double* data, size_t n) override;
  // Device arrays: one NCCL group (a single launch) per 256 arrays.
  void AllReduceSumMany(const std::vector<std::pair<float*, size_t>>& arrays) override;
  void AllGather(const float* in, float* out, size_t n) override;
  void ReduceScatter(const float* in, float* out, size_t n) override;
  void AllToAll(const float* in, float* out, size_t n) override;
  void Broadcast(float* data, size_t n, int root) override;
  void Broadcast16(uint16_t* data, size_t n, int root) override;
  void SendAsync(const float* data, size_t n, int peer, uint32_t tag) override;
  void Recv(float* data, size_t n, int peer, uint32_t tag) override;
  void WaitSends() override;
  // Every rank of the group has reached it, and this rank's stream is drained.
  void Barrier() override;

  // Typed entry points (device memory, work enqueued on `s`). `n` counts elements per rank:
  // AllGather's `out` and ReduceScatter's `in` hold size()·n. Inputs and outputs may overlap.
  void AllReduce(void* data, size_t n, CommType t, cudaStream_t s, ReduceOp op = ReduceOp::kSum);
  void AllGather(const void* in, void* out, size_t n, CommType t, cudaStream_t s);
  void ReduceScatter(const void* in, void* out, size_t n, CommType t, cudaStream_t s);
  void Broadcast(void* data, size_t n, CommType t, int root, cudaStream_t s);
  // Copies `data` (after the work already on `s`) and returns; the buffer is free again for work
  // enqueued on `s` afterwards. The transfer runs on an internal stream.
  void Send(const void* data, size_t n, CommType t, int peer, cudaStream_t s);
  // Work enqueued on `s` afterwards sees the data; nothing waits on the host.
  void RecvRaw(void* data, size_t n, CommType t, int peer, cudaStream_t s);
  // Work enqueued on `s` afterwards runs once every send so far has been received.
  void WaitSends(cudaStream_t s);

  // Runs NCCL calls of one's own on comm() (say ncclGroupStart, ops, ncclGroupEnd, returning the
  // last result) the way the methods above do: under the process's NCCL lock (the watchdog polls
  // every communicator), waiting out ncclInProgress until launched, watched for progress on `s`.
  // Calling NCCL on comm() directly skips all three. Not for a group of one.
  void Enqueue(const char* op, cudaStream_t s, const std::function<ncclResult_t(ncclComm_t)>& f);

  // Milliseconds the receiving streams stood waiting for data in RecvRaw/Recv since the last call
  // (the pipeline bubble plus transfer time on this rank), measured with events; waits for the
  // receives to complete.
  double TakeRecvWaitMs();
  ncclComm_t comm() const { return comm_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& members() const { return members_; }

 private:
  NcclChannel& Channel(int peer, bool send);
  void AnyAllReduce(void* data, size_t n, CommType t, ReduceOp op);
  // Broadcast of n elements of `bytes` each, device or host memory (staged), on MainStream().
  void StagedBroadcast(void* data, size_t n, size_t bytes, CommType t, int root);

  std::shared_ptr<NcclRuntime> runtime_;
  std::string name_;
  std::vector<int> members_;
  int rank_;
  ncclComm_t comm_;
  std::map<int, NcclChannel*> send_, recv_;  // by peer (group rank); owned by the runtime
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> waits_;  // around each receive's stream wait
  size_t waits_used_ = 0;
  double pending_wait_ms_ = 0.0;
};

// The NcclCommunicator behind `c`, or null (another backend, or a wrapper such as
// MakeTimedCommunicator's).
NcclCommunicator* AsNccl(Communicator* c);

// Selects this rank's GPU (cudaSetDevice(local_rank % device count): call it before any other CUDA
// work, MainStream() belongs to that device), meets the other ranks through the TCP store at
// MASTER_ADDR:MASTER_PORT (rank 0 serves it for the whole run) and creates the world, tp, dp, pp,
// model and embedding groups with comm_gloo's membership and rank order, every one an
// NcclCommunicator. World size 1 needs no rendezvous. The watchdog runs while any communicator
// lives; destroy the groups before the process exits (rank 0 then waits until every rank is done
// with the store): a rank that exits without destroying them looks dead to the others.
absl::StatusOr<ProcessGroups> CreateNcclProcessGroups(const LaunchInfo& launch,
                                                      const ParallelSizes& sizes,
                                                      const DistOptions& options = {});

}  // namespace leantron::trainer
