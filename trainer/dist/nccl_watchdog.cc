// The NCCL backend's watchdog: no rank hangs when another dies. Launch waits with a deadline,
// progress of every enqueued operation, heartbeats through the store, one clear line and an exit
// on any failure; and the orderly teardown of every communicator.
#include <algorithm>
#include <exception>

#include "trainer/dist/nccl_runtime.h"

namespace leantron::trainer {

using namespace nccl_detail;

void NcclRuntime::WaitLaunched(ncclComm_t comm, ncclResult_t r, const char* op,
                               const std::string& group) {
  const auto deadline = Clock::now() + nccl_timeout_;
  for (int spins = 0; r == ncclInProgress; ++spins) {
    if (fatal_.load()) Hang();
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      if (Clock::now() > deadline) {
        Fatal(absl::StrCat("NCCL ", op, " on group ", group, " was not launched within ",
                           SecondsOf(nccl_timeout_), " s (--distributed-timeout-minutes)"),
              true);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (const ncclResult_t q = ncclCommGetAsyncError(comm, &r); q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) {
    if (fatal_.load()) Hang();
    Fatal(absl::StrCat("NCCL ", op, " on group ", group, " failed: ", ncclGetErrorString(r), " (",
                       ncclGetLastError(comm), ")"),
          true);
  }
}

void NcclRuntime::Track(cudaStream_t s, const char* op, const std::string& group) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  // An event recorded while a graph is captured says nothing about progress: leave it out.
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
    return;
  std::lock_guard<std::mutex> lock(track_mu_);
  cudaEvent_t ev;
  if (free_events_.empty()) {
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  } else {
    ev = free_events_.back();
    free_events_.pop_back();
  }
  LT_CUDA_CHECK(cudaEventRecord(ev, s));
  pending_[s].push_back({ev, Clock::now(), op, group});
}

std::string NcclRuntime::CheckProgress() {
  std::lock_guard<std::mutex> lock(track_mu_);
  const auto now = Clock::now();
  for (auto& [stream, queue] : pending_) {
    while (!queue.empty()) {
      const cudaError_t e = cudaEventQuery(queue.front().event);
      if (e == cudaErrorNotReady) break;
      if (e != cudaSuccess) (void)cudaGetLastError();
      free_events_.push_back(queue.front().event);
      queue.pop_front();
      progressed_[stream] = now;
    }
    if (queue.empty()) continue;
    const Pending& p = queue.front();
    auto it = progressed_.find(stream);
    const auto since = it == progressed_.end() ? p.enqueued : std::max(p.enqueued, it->second);
    if (now - since > nccl_timeout_) {
      return absl::StrCat("NCCL ", p.op, " on group ", p.group, " made no progress for ",
                          SecondsOf(now - since), " s (--distributed-timeout-minutes)");
    }
  }
  return "";
}

void NcclRuntime::ProgressLoop() {
  (void)cudaSetDevice(device_);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(thread_mu_);
      if (thread_cv_.wait_for(lock, std::chrono::milliseconds(200),
                              [this] { return stop_progress_; }))
        return;
    }
    std::string problem;
    {
      std::unique_lock<std::mutex> nccl_lock(nccl_mu_, std::try_to_lock);
      if (nccl_lock.owns_lock()) {
        std::lock_guard<std::timed_mutex> comms_lock(comms_mu_);
        for (const CommEntry& c : comms_) {
          ncclResult_t e = ncclSuccess;
          if (ncclCommGetAsyncError(c.comm, &e) == ncclSuccess && e != ncclSuccess &&
              e != ncclInProgress) {
            problem = absl::StrCat("NCCL error on group ", c.name, ": ", ncclGetErrorString(e),
                                   " (", ncclGetLastError(c.comm), ")");
            break;
          }
        }
      }
    }
    if (problem.empty()) problem = CheckProgress();
    if (!problem.empty()) Fatal(problem, true);
  }
}

void NcclRuntime::HeartbeatLoop() {
  struct Peer {
    std::string beat;
    Clock::time_point changed;
    bool left = false;
  };
  std::map<int, Peer> peers;  // ring neighbours; every rank while rank 0 waits for the others
  for (int q : {(rank() + 1) % world(), (rank() + world() - 1) % world()}) {
    if (q != rank()) peers[q] = Peer{"", Clock::now(), false};
  }
  uint64_t beat = 0;
  bool draining = false;
  while (true) {
    bool stop;
    {
      std::lock_guard<std::mutex> lock(thread_mu_);
      stop = stop_heartbeat_;
    }
    if (stop && !draining) {
      // A rank whose setup failed just stops: the others see it die.
      if (!initialized_) return;
      if (rank() != 0) {
        // Done: the others stop watching this rank.
        std::lock_guard<std::timed_mutex> lock(hb_mu_);
        try {
          hb_store_->set(HbKey(rank()), Bytes("bye"));
        } catch (const std::exception&) {
        }
        return;
      }
      // Rank 0 serves the store until every other rank is done with it.
      draining = true;
      for (int q = 1; q < world(); ++q) peers.try_emplace(q, Peer{"", Clock::now(), false});
    }
    std::string problem, store_error;
    bool propagated = false;
    {
      std::lock_guard<std::timed_mutex> lock(hb_mu_);
      try {
        hb_store_->set(HbKey(rank()), Bytes(std::to_string(++beat)));
        const auto now = Clock::now();
        for (auto& [q, p] : peers) {
          if (p.left) continue;
          const std::vector<char> v = hb_store_->get(HbKey(q));
          const std::string value(v.begin(), v.end());
          if (value == "bye") {
            p.left = true;
          } else if (value != p.beat) {
            p.beat = value;
            p.changed = now;
          } else if (now - p.changed > heartbeat_timeout_ && problem.empty()) {
            problem = absl::StrCat("lost rank ", q, " (no heartbeat for ",
                                   SecondsOf(now - p.changed), " s)");
          }
        }
        if (problem.empty()) {
          const std::vector<char> v = hb_store_->get("abort");
          if (!v.empty()) {
            problem = absl::StrCat("stopping: ", std::string(v.begin(), v.end()));
            propagated = true;
          }
        }
      } catch (const std::exception& e) {
        store_error = e.what();
      }
    }
    if (!store_error.empty()) {
      Fatal(absl::StrCat("lost the rendezvous store at ", StoreAddress(), " (", store_error,
                         "; has rank 0 exited?)"),
            false);
    }
    if (!problem.empty()) Fatal(problem, !propagated);
    if (draining) {
      bool all_left = true;
      for (const auto& [q, p] : peers) all_left = all_left && p.left;
      if (all_left) return;
    }
    std::unique_lock<std::mutex> lock(thread_mu_);
    thread_cv_.wait_for(lock, seconds(1), [&] { return stop_heartbeat_ && !draining; });
  }
}

void NcclRuntime::Fatal(const std::string& what, bool publish) {
  if (fatal_.exchange(true)) Hang();  // another thread is already on its way out
  const std::string line = absl::StrCat("leantron: rank ", rank(), " ", what, "; exiting\n");
  if (write(STDERR_FILENO, line.data(), line.size()) < 0) {
  }
  // An abort that hangs must not keep the process alive.
  std::thread([] {
    std::this_thread::sleep_for(seconds(10));
    _exit(1);
  }).detach();
  if (publish && hb_store_ != nullptr) {
    std::unique_lock<std::timed_mutex> lock(hb_mu_, std::defer_lock);
    if (lock.try_lock_for(seconds(2))) {
      try {
        hb_store_->set("abort", Bytes(absl::StrCat("rank ", rank(), " ", what)));
      } catch (const std::exception&) {
      }
    }
  }
  // No ncclCommAbort here: with the main thread inside an NCCL call, aborting from this thread
  // tripped NCCL 2.28's proxy assertion (the process then died of SIGABRT instead of exiting).
  // Exiting releases the communicators; every peer's own watchdog sees this rank go.
  // Rank 0 serves the store: give the others a poll (1 s) to read the reason before it goes.
  if (server_ != nullptr) std::this_thread::sleep_for(seconds(2));
  _exit(1);
}

NcclRuntime::~NcclRuntime() {
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_progress_ = true;
  }
  thread_cv_.notify_all();
  if (progress_.joinable()) progress_.join();

  // Flush and free every communicator (creation order: the same on every rank), the heartbeat
  // still watching the peers meanwhile.
  std::vector<CommEntry> comms;
  {
    std::lock_guard<std::timed_mutex> lock(comms_mu_);
    comms.swap(comms_);
  }
  for (const CommEntry& c : comms) {
    ncclResult_t r = ncclCommFinalize(c.comm);
    const auto deadline = Clock::now() + nccl_timeout_;
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (const ncclResult_t q = ncclCommGetAsyncError(c.comm, &r); q != ncclSuccess) r = q;
    }
    if (r == ncclSuccess) {
      ncclCommDestroy(c.comm);
    } else {
      std::fprintf(stderr,
                   "leantron: rank %d: NCCL communicator %s did not finish its work (%s); "
                   "aborting it\n",
                   rank(), c.name.c_str(), ncclGetErrorString(r));
      ncclCommAbort(c.comm);
    }
  }
  for (auto& [key, ch] : channels_) {
    for (NcclChannel::Buffer& b : ch->staging) {
      (void)cudaFreeAsync(b.ptr, ch->stream);
      (void)cudaEventDestroy(b.free);
    }
    (void)cudaStreamSynchronize(ch->stream);
    (void)cudaEventDestroy(ch->ready);
    (void)cudaEventDestroy(ch->done);
    (void)cudaStreamDestroy(ch->stream);
  }
  channels_.clear();
  for (auto& [stream, queue] : pending_) {
    for (const Pending& p : queue) (void)cudaEventDestroy(p.event);
  }
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  if (scratch_ != nullptr) (void)cudaFree(scratch_);

  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_heartbeat_ = true;
  }
  thread_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  hb_store_.reset();
  store_.reset();
  server_.reset();
}

}  // namespace leantron::trainer
