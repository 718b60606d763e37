// Internal to the NCCL backend (trainer/dist/nccl_*.cc): the per-process runtime every
// NcclCommunicator shares, and the point-to-point channels.
//   nccl_rendezvous.cc  the store, the rendezvous barrier, NCCL ids, communicators and channels
//   nccl_watchdog.cc    launch waits, progress tracking, heartbeats, the fatal exit, teardown
//   nccl_comm.cc        NcclCommunicator (collectives, point-to-point, host staging)
//   nccl_groups.cc      CreateNcclProcessGroups
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/dist/nccl_comm.h"
#include "trainer/dist/tcp_store.h"

namespace leantron::trainer {

using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

// One direction of point-to-point between two ranks: a two-rank NCCL communicator (sender is its
// rank 0, receiver its rank 1) and a stream of its own, so a send that waits for its receiver
// blocks neither the compute nor the other direction.
struct NcclChannel {
  std::string name;  // "<group>:<from>-><to>" in world ranks
  ncclComm_t comm = nullptr;
  bool send = true;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // the caller's stream → this stream
  cudaEvent_t done = nullptr;   // this stream → the caller's stream
  // Sender: copies of the messages in flight; a buffer is free again once `free` has completed.
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    cudaEvent_t free = nullptr;
    bool recorded = false;
  };
  std::vector<Buffer> staging;
};

namespace nccl_detail {

inline size_t TypeBytes(CommType t) {
  switch (t) {
    case CommType::kF32:
      return 4;
    case CommType::kBF16:
      return 2;
    case CommType::kF64:
      return 8;
  }
  return 4;
}

inline ncclDataType_t NcclType(CommType t) {
  switch (t) {
    case CommType::kF32:
      return ncclFloat32;
    case CommType::kBF16:
      return ncclBfloat16;
    case CommType::kF64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

// Device (or managed) memory NCCL can use directly; anything else is staged.
inline bool OnDevice(const void* p) {
  cudaPointerAttributes a = {};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

inline bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

inline long long SecondsOf(Clock::duration d) {
  return std::chrono::duration_cast<seconds>(d).count();
}

inline std::vector<char> Bytes(const std::string& s) {
  return std::vector<char>(s.begin(), s.end());
}

[[noreturn]] inline void Hang() {
  while (true) pause();
}

[[noreturn]] inline void Misuse(const std::string& what) {
  std::fprintf(stderr, "NCCL backend: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline std::string HbKey(int rank) { return absl::StrCat("hb/", rank); }
inline std::string IdKey(const std::string& key) { return absl::StrCat("nccl-id/", key); }
inline std::string ChannelKey(const std::string& group, int from, int to) {
  return absl::StrCat(group, ":", from, "->", to);
}

}  // namespace nccl_detail

// Everything one process shares between its communicators: the store (a connection for the main
// thread, one for the watchdog), the watchdog threads, and every NCCL communicator and channel.
class NcclRuntime {
 public:
  NcclRuntime(const LaunchInfo& launch, int device, const DistOptions& options)
      : launch_(launch),
        device_(device),
        rendezvous_timeout_(seconds(options.rendezvous_timeout_s)),
        nccl_timeout_(seconds(options.timeout_s)),
        heartbeat_timeout_(seconds(options.heartbeat_timeout_s)) {}
  ~NcclRuntime();
  NcclRuntime(const NcclRuntime&) = delete;
  NcclRuntime& operator=(const NcclRuntime&) = delete;

  int rank() const { return launch_.rank; }
  int world() const { return launch_.world_size; }
  void SetInitialized() { initialized_ = true; }

  // Store, barrier of every rank, watchdog.
  absl::Status Rendezvous();
  // Publishes a fresh ncclUniqueId for `key` (this rank creates that communicator's id).
  absl::Status PublishId(const std::string& key);
  // This rank's communicator `key` (rank `rank` of `nranks`), its id read from the store; waits
  // until it is ready.
  absl::StatusOr<ncclComm_t> CreateComm(const std::string& key, int nranks, int rank);
  // Channel from world rank `from` to world rank `to` of `group`; its id is published by `from`.
  absl::StatusOr<NcclChannel*> CreateChannel(const std::string& group, int from, int to);
  // Connects every communicator and channel (NCCL connects lazily, at the first operation).
  void WarmUp(const std::vector<std::pair<ncclComm_t, std::string>>& comms,
              const std::vector<NcclChannel*>& channels);
  // The channel `from` → `to` of `group` (one of them this rank); after setup, a pair not made
  // then is connected now, blocking until the peer asks for it too.
  NcclChannel* GetChannel(const std::string& group, int from, int to);

  // Runs the NCCL call `f` on `comm` and waits until it is launched (a non-blocking communicator
  // launches on a helper thread); an error is fatal.
  template <typename F>
  void Call(ncclComm_t comm, const char* op, const std::string& group, F&& f) {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    WaitLaunched(comm, f(), op, group);
  }
  // Watches the operation just enqueued on `s` for progress.
  void Track(cudaStream_t s, const char* op, const std::string& group);
  // Staging buffer of at least `bytes` that no transfer uses any more (a new one is allocated in
  // stream order on `s`).
  NcclChannel::Buffer& Staging(NcclChannel& ch, size_t bytes, cudaStream_t s);
  void* scratch() const { return scratch_; }

  // Prints "leantron: rank R <what>; exiting", tells the other ranks (when
  // `publish`), aborts every communicator and exits the process.
  [[noreturn]] void Fatal(const std::string& what, bool publish);

 private:
  struct CommEntry {
    ncclComm_t comm;
    std::string name;
  };
  struct Pending {
    cudaEvent_t event;
    Clock::time_point enqueued;
    const char* op;
    std::string group;
  };

  void WaitLaunched(ncclComm_t comm, ncclResult_t r, const char* op, const std::string& group);
  absl::StatusOr<ncclComm_t> InitComm(const std::string& key, const ncclUniqueId& id, int nranks,
                                      int rank);
  void ConnectPair(const std::string& group, int peer);
  void HeartbeatLoop();
  void ProgressLoop();
  std::string CheckProgress();
  std::string StoreAddress() const {
    return absl::StrCat(launch_.master_addr, ":", launch_.master_port);
  }

  const LaunchInfo launch_;
  const int device_;
  const Clock::duration rendezvous_timeout_, nccl_timeout_, heartbeat_timeout_;
  std::atomic<bool> initialized_{false};

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStore> store_;     // main thread
  std::unique_ptr<TcpStore> hb_store_;  // watchdog (and Fatal), under hb_mu_
  std::timed_mutex hb_mu_;
  std::set<std::string> published_;

  // Serialises NCCL calls: ncclCommGetAsyncError completes a non-blocking communicator's pending
  // launch and is not safe against a concurrent call on the same communicator.
  std::mutex nccl_mu_;
  std::timed_mutex comms_mu_;  // comms_ (Fatal reads it from any thread)
  std::vector<CommEntry> comms_;
  std::deque<std::string> comm_names_;  // ncclConfig_t::commName storage
  std::map<std::string, std::unique_ptr<NcclChannel>> channels_;
  void* scratch_ = nullptr;

  std::mutex track_mu_;
  std::map<cudaStream_t, std::deque<Pending>> pending_;
  std::map<cudaStream_t, Clock::time_point> progressed_;
  std::vector<cudaEvent_t> free_events_;

  std::atomic<bool> fatal_{false};
  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  bool stop_progress_ = false, stop_heartbeat_ = false;
  std::thread heartbeat_, progress_;
};

}  // namespace leantron::trainer
