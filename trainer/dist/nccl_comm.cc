#include "trainer/dist/nccl_comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/rendezvous_signals.h"
#include "trainer/tcp_store.h"

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

namespace {

int EnvSeconds(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const int s = std::atoi(v);
  return s > 0 ? s : fallback;
}

size_t TypeBytes(CommType t) {
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

ncclDataType_t NcclType(CommType t) {
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
bool OnDevice(const void* p) {
  cudaPointerAttributes a = {};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

long long SecondsOf(Clock::duration d) { return std::chrono::duration_cast<seconds>(d).count(); }

std::vector<char> Bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

[[noreturn]] void Hang() {
  while (true) pause();
}

[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "NCCL backend: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// The device view of host or device pointers for one call of the Communicator interface: host
// memory is copied to stream-ordered device buffers, and back (with a stream synchronisation) by
// Finish().
class HostStaging {
 public:
  explicit HostStaging(cudaStream_t s) : s_(s) {}
  ~HostStaging() { Finish(); }
  void* Map(const void* p, size_t bytes, bool copy_in, bool copy_out) {
    if (bytes == 0 || OnDevice(p)) return const_cast<void*>(p);
    void* dev = nullptr;
    LT_CUDA_CHECK(cudaMallocAsync(&dev, bytes, s_));
    if (copy_in) LT_CUDA_CHECK(cudaMemcpyAsync(dev, p, bytes, cudaMemcpyHostToDevice, s_));
    entries_.push_back({const_cast<void*>(p), dev, bytes, copy_out});
    return dev;
  }
  void Finish() {
    if (entries_.empty()) return;
    for (const Entry& e : entries_) {
      if (e.copy_out)
        LT_CUDA_CHECK(cudaMemcpyAsync(e.host, e.dev, e.bytes, cudaMemcpyDeviceToHost, s_));
      LT_CUDA_CHECK(cudaFreeAsync(e.dev, s_));
    }
    entries_.clear();
    LT_CUDA_CHECK(cudaStreamSynchronize(s_));
  }

 private:
  struct Entry {
    void* host;
    void* dev;
    size_t bytes;
    bool copy_out;
  };
  cudaStream_t s_;
  std::vector<Entry> entries_;
};

std::string HbKey(int rank) { return absl::StrCat("hb/", rank); }
std::string IdKey(const std::string& key) { return absl::StrCat("nccl-id/", key); }
std::string ChannelKey(const std::string& group, int from, int to) {
  return absl::StrCat(group, ":", from, "->", to);
}

}  // namespace

// Everything one process shares between its communicators: the store (a connection for the main
// thread, one for the watchdog), the watchdog threads, and every NCCL communicator and channel.
class NcclRuntime {
 public:
  NcclRuntime(const LaunchInfo& launch, int device)
      : launch_(launch),
        device_(device),
        rendezvous_timeout_(seconds(EnvSeconds("LEANTRON_RENDEZVOUS_TIMEOUT", 300))),
        nccl_timeout_(seconds(EnvSeconds("LEANTRON_NCCL_TIMEOUT", 600))),
        heartbeat_timeout_(seconds(EnvSeconds("LEANTRON_HEARTBEAT_TIMEOUT", 20))),
        blocking_(EnvSeconds("LEANTRON_NCCL_BLOCKING", 0) == 1) {}
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
  const bool blocking_;
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

absl::Status NcclRuntime::Rendezvous() {
  const std::string where = StoreAddress();
  const long long limit = SecondsOf(rendezvous_timeout_);
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(rendezvous_timeout_);
  if (rank() == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> s = TcpStoreServer::Start(launch_);
    if (!s.ok()) return s.status();
    server_ = std::move(*s);
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> c =
      TcpStore::Connect(launch_, timeout, timeout);
  if (!c.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank(), " could not reach the rendezvous store at ", where, " within ", limit,
        " s (LEANTRON_RENDEZVOUS_TIMEOUT; is rank 0 running, are MASTER_ADDR/MASTER_PORT right?): ",
        c.status().message()));
  }
  store_ = std::move(*c);
  // Barrier: every rank announces itself; rank 0 sees them all and opens the run.
  try {
    store_->set(HbKey(rank()), Bytes("0"));
    if (rank() == 0) {
      for (int r = 1; r < world(); ++r) {
        try {
          store_->get(HbKey(r));
        } catch (const std::exception&) {
          return absl::DeadlineExceededError(
              absl::StrCat("rank ", r, " did not reach the rendezvous at ", where, " within ",
                           limit, " s (LEANTRON_RENDEZVOUS_TIMEOUT)"));
        }
      }
      store_->set("abort", {});
      store_->set("ready", Bytes("1"));
    }
    store_->get("ready");
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank(), ": the rendezvous at ", where, " did not complete within ", limit,
        " s (LEANTRON_RENDEZVOUS_TIMEOUT; a rank never arrived, or rank 0 is gone): ", e.what()));
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> hb =
      TcpStore::Connect(launch_, seconds(30), seconds(30));
  if (!hb.ok()) return hb.status();
  hb_store_ = std::move(*hb);
  LT_CUDA_CHECK(cudaMalloc(&scratch_, 256));
  LT_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, 256, cuda::MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(cuda::MainStream()));
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  progress_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

absl::Status NcclRuntime::PublishId(const std::string& key) {
  if (!published_.insert(key).second) return absl::OkStatus();
  ncclUniqueId id;
  if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId for ", key, ": ",
                                               ncclGetErrorString(r), " (",
                                               ncclGetLastError(nullptr), ")"));
  }
  try {
    store_->set(IdKey(key), std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("publishing the NCCL id of ", key, " at ", StoreAddress(), ": ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ncclComm_t> NcclRuntime::CreateComm(const std::string& key, int nranks, int rank) {
  std::vector<char> bytes;
  try {
    bytes = store_->get(IdKey(key));
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", this->rank(), ": no NCCL id for group ", key, " at ", StoreAddress(), " within ",
        SecondsOf(rendezvous_timeout_), " s (LEANTRON_RENDEZVOUS_TIMEOUT): ", e.what()));
  }
  ncclUniqueId id;
  if (bytes.size() != sizeof(id.internal)) {
    return absl::InternalError(absl::StrCat("malformed NCCL id for group ", key));
  }
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return InitComm(key, id, nranks, rank);
}

absl::StatusOr<ncclComm_t> NcclRuntime::InitComm(const std::string& key, const ncclUniqueId& id,
                                                 int nranks, int rank) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking_ ? 1 : 0;
  config.commName = comm_names_.emplace_back(key).c_str();
  // LEANTRON_NCCL_CTA_POLICY=efficiency|zero: NCCL uses fewer (or, where it can, no) thread
  // blocks for its collectives, leaving the SMs to the computation it overlaps with.
  if (const char* policy = std::getenv("LEANTRON_NCCL_CTA_POLICY")) {
    const std::string p = policy;
    if (p == "efficiency") config.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
    if (p == "zero") config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    if (p == "default") config.CTAPolicy = NCCL_CTA_POLICY_DEFAULT;
  }
  std::lock_guard<std::mutex> lock(nccl_mu_);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  const auto deadline = Clock::now() + rendezvous_timeout_;
  while (r == ncclInProgress) {
    if (fatal_.load()) Hang();
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", this->rank(), ": NCCL communicator ", key, " (rank ", rank, " of ",
                       nranks, ") was not ready within ", SecondsOf(rendezvous_timeout_),
                       " s (LEANTRON_RENDEZVOUS_TIMEOUT)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (const ncclResult_t q = ncclCommGetAsyncError(comm, &r); q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess) {
    const std::string detail = ncclGetLastError(comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(absl::StrCat("rank ", this->rank(),
                                               ": cannot create NCCL communicator ", key, ": ",
                                               ncclGetErrorString(r), " (", detail, ")"));
  }
  std::lock_guard<std::timed_mutex> comms_lock(comms_mu_);
  comms_.push_back({comm, key});
  return comm;
}

absl::StatusOr<NcclChannel*> NcclRuntime::CreateChannel(const std::string& group, int from,
                                                        int to) {
  const std::string key = ChannelKey(group, from, to);
  if (auto it = channels_.find(key); it != channels_.end()) return it->second.get();
  absl::StatusOr<ncclComm_t> comm = CreateComm(key, 2, from == rank() ? 0 : 1);
  if (!comm.ok()) return comm.status();
  auto ch = std::make_unique<NcclChannel>();
  ch->name = key;
  ch->comm = *comm;
  ch->send = from == rank();
  int least = 0, greatest = 0;
  LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  LT_CUDA_CHECK(cudaStreamCreateWithPriority(&ch->stream, cudaStreamNonBlocking, greatest));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&ch->ready, cudaEventDisableTiming));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&ch->done, cudaEventDisableTiming));
  NcclChannel* raw = ch.get();
  channels_[key] = std::move(ch);
  return raw;
}

void NcclRuntime::WarmUp(const std::vector<std::pair<ncclComm_t, std::string>>& comms,
                         const std::vector<NcclChannel*>& channels) {
  const cudaStream_t s = cuda::MainStream();
  float* buf = static_cast<float*>(scratch_);
  // Collectives in group order (every rank uses the same order).
  for (const auto& [comm, name] : comms) {
    Call(comm, "warm-up AllReduce", name,
         [&] { return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclMax, comm, s); });
  }
  // Every channel's first operation before waiting for any: each needs its peer's.
  {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    std::vector<ncclResult_t> results;
    for (NcclChannel* ch : channels) {
      results.push_back(ch->send ? ncclSend(buf + 8, 1, ncclFloat32, 1, ch->comm, ch->stream)
                                 : ncclRecv(buf + 16, 1, ncclFloat32, 0, ch->comm, ch->stream));
    }
    for (size_t i = 0; i < channels.size(); ++i) {
      WaitLaunched(channels[i]->comm, results[i], "warm-up send/recv", channels[i]->name);
    }
  }
  for (NcclChannel* ch : channels) Track(ch->stream, "warm-up send/recv", ch->name);
  if (!comms.empty()) {
    Track(s, "warm-up AllReduce", "all groups");
    LT_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  for (NcclChannel* ch : channels) LT_CUDA_CHECK(cudaStreamSynchronize(ch->stream));
}

void NcclRuntime::ConnectPair(const std::string& group, int peer) {
  // Both directions, the lower rank's outgoing channel first: the same order on both ranks.
  const int lo = std::min(rank(), peer), hi = std::max(rank(), peer);
  if (absl::Status s = PublishId(ChannelKey(group, rank(), peer)); !s.ok()) {
    Fatal(absl::StrCat("cannot connect to rank ", peer, " of group ", group, ": ", s.message()),
          true);
  }
  std::vector<NcclChannel*> made;
  for (const auto& [from, to] : {std::pair{lo, hi}, std::pair{hi, lo}}) {
    absl::StatusOr<NcclChannel*> ch = CreateChannel(group, from, to);
    if (!ch.ok()) {
      Fatal(absl::StrCat("cannot connect to rank ", peer, " of group ", group, ": ",
                         ch.status().message()),
            true);
    }
    made.push_back(*ch);
  }
  WarmUp({}, made);
}

NcclChannel* NcclRuntime::GetChannel(const std::string& group, int from, int to) {
  const std::string key = ChannelKey(group, from, to);
  if (channels_.find(key) == channels_.end()) ConnectPair(group, from == rank() ? to : from);
  return channels_.at(key).get();
}

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
                           SecondsOf(nccl_timeout_), " s (LEANTRON_NCCL_TIMEOUT)"),
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

NcclChannel::Buffer& NcclRuntime::Staging(NcclChannel& ch, size_t bytes, cudaStream_t s) {
  NcclChannel::Buffer* best = nullptr;
  for (NcclChannel::Buffer& b : ch.staging) {
    if (b.bytes < bytes || (best != nullptr && b.bytes >= best->bytes)) continue;
    if (b.recorded && cudaEventQuery(b.free) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    best = &b;
  }
  if (best != nullptr) return *best;
  // No buffer is free: a new one, kept while the run lasts. Stream-ordered: cudaMalloc and
  // cudaFree may wait for the device, and a send waiting for its receiver may never finish then.
  NcclChannel::Buffer& b = ch.staging.emplace_back();
  b.bytes = std::max<size_t>(bytes, 256);
  LT_CUDA_CHECK(cudaMallocAsync(&b.ptr, b.bytes, s));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&b.free, cudaEventDisableTiming));
  return b;
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
                          SecondsOf(now - since), " s (LEANTRON_NCCL_TIMEOUT)");
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

// ---------------------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclRuntime> runtime, std::string name,
                                   std::vector<int> members, int rank, ncclComm_t comm)
    : runtime_(std::move(runtime)),
      name_(std::move(name)),
      members_(std::move(members)),
      rank_(rank),
      comm_(comm) {}

NcclCommunicator::~NcclCommunicator() {
  for (auto& [a, b] : waits_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
}

void NcclCommunicator::AllReduce(void* data, size_t n, CommType t, cudaStream_t s, ReduceOp op) {
  if (n == 0 || size() == 1) return;
  const ncclRedOp_t red = op == ReduceOp::kMax ? ncclMax : ncclSum;
  runtime_->Call(comm_, "AllReduce", name_,
                 [&] { return ncclAllReduce(data, data, n, NcclType(t), red, comm_, s); });
  runtime_->Track(s, "AllReduce", name_);
}

void NcclCommunicator::AllGather(const void* in, void* out, size_t n, CommType t, cudaStream_t s) {
  if (n == 0) return;
  const size_t bytes = n * TypeBytes(t);
  char* dst = static_cast<char*>(out);
  if (size() == 1) {
    if (in != out) LT_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDefault, s));
    return;
  }
  const void* src = in;
  void* tmp = nullptr;
  // NCCL's in-place form has this rank's block already in place; any other overlap needs a copy.
  if (in != dst + rank_ * bytes && Overlaps(in, bytes, out, bytes * size())) {
    LT_CUDA_CHECK(cudaMallocAsync(&tmp, bytes, s));
    LT_CUDA_CHECK(cudaMemcpyAsync(tmp, in, bytes, cudaMemcpyDeviceToDevice, s));
    src = tmp;
  }
  runtime_->Call(comm_, "AllGather", name_,
                 [&] { return ncclAllGather(src, out, n, NcclType(t), comm_, s); });
  runtime_->Track(s, "AllGather", name_);
  if (tmp != nullptr) LT_CUDA_CHECK(cudaFreeAsync(tmp, s));
}

void NcclCommunicator::ReduceScatter(const void* in, void* out, size_t n, CommType t,
                                     cudaStream_t s) {
  if (n == 0) return;
  const size_t bytes = n * TypeBytes(t);
  const char* src = static_cast<const char*>(in);
  if (size() == 1) {
    if (in != out) LT_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDefault, s));
    return;
  }
  void* tmp = nullptr;
  const size_t total = bytes * size();
  if (out != src + rank_ * bytes && Overlaps(in, total, out, bytes)) {
    LT_CUDA_CHECK(cudaMallocAsync(&tmp, total, s));
    LT_CUDA_CHECK(cudaMemcpyAsync(tmp, in, total, cudaMemcpyDeviceToDevice, s));
    in = tmp;
  }
  runtime_->Call(comm_, "ReduceScatter", name_,
                 [&] { return ncclReduceScatter(in, out, n, NcclType(t), ncclSum, comm_, s); });
  runtime_->Track(s, "ReduceScatter", name_);
  if (tmp != nullptr) LT_CUDA_CHECK(cudaFreeAsync(tmp, s));
}

void NcclCommunicator::Broadcast(void* data, size_t n, CommType t, int root, cudaStream_t s) {
  if (root < 0 || root >= size()) Misuse(absl::StrCat("Broadcast root ", root, " on ", name_));
  if (n == 0 || size() == 1) return;
  runtime_->Call(comm_, "Broadcast", name_,
                 [&] { return ncclBroadcast(data, data, n, NcclType(t), root, comm_, s); });
  runtime_->Track(s, "Broadcast", name_);
}

void NcclCommunicator::Enqueue(const char* op, cudaStream_t s,
                               const std::function<ncclResult_t(ncclComm_t)>& f) {
  if (comm_ == nullptr) Misuse(absl::StrCat(op, " on group ", name_, ", a group of one"));
  runtime_->Call(comm_, op, name_, [&] { return f(comm_); });
  runtime_->Track(s, op, name_);
}

NcclChannel& NcclCommunicator::Channel(int peer, bool send) {
  std::map<int, NcclChannel*>& cache = send ? send_ : recv_;
  if (auto it = cache.find(peer); it != cache.end()) return *it->second;
  if (peer < 0 || peer >= size() || peer == rank_) {
    Misuse(absl::StrCat(send ? "send to" : "receive from", " rank ", peer, " of group ", name_,
                        " (rank ", rank_, " of ", size(), ")"));
  }
  const int me = members_[rank_], other = members_[peer];
  NcclChannel* ch =
      send ? runtime_->GetChannel(name_, me, other) : runtime_->GetChannel(name_, other, me);
  cache[peer] = ch;
  return *ch;
}

void NcclCommunicator::Send(const void* data, size_t n, CommType t, int peer, cudaStream_t s) {
  NcclChannel& ch = Channel(peer, true);
  if (n == 0) return;
  const size_t bytes = n * TypeBytes(t);
  NcclChannel::Buffer& buf = runtime_->Staging(ch, bytes, s);
  LT_CUDA_CHECK(cudaMemcpyAsync(buf.ptr, data, bytes, cudaMemcpyDefault, s));
  LT_CUDA_CHECK(cudaEventRecord(ch.ready, s));
  LT_CUDA_CHECK(cudaStreamWaitEvent(ch.stream, ch.ready, 0));
  runtime_->Call(ch.comm, "Send", ch.name,
                 [&] { return ncclSend(buf.ptr, n, NcclType(t), 1, ch.comm, ch.stream); });
  LT_CUDA_CHECK(cudaEventRecord(buf.free, ch.stream));
  buf.recorded = true;
  runtime_->Track(ch.stream, "Send", ch.name);
}

void NcclCommunicator::RecvRaw(void* data, size_t n, CommType t, int peer, cudaStream_t s) {
  NcclChannel& ch = Channel(peer, false);
  if (n == 0) return;
  // The receive starts once the work already on `s` (which may still read `data`) is done.
  LT_CUDA_CHECK(cudaEventRecord(ch.ready, s));
  LT_CUDA_CHECK(cudaStreamWaitEvent(ch.stream, ch.ready, 0));
  runtime_->Call(ch.comm, "Recv", ch.name,
                 [&] { return ncclRecv(data, n, NcclType(t), 0, ch.comm, ch.stream); });
  LT_CUDA_CHECK(cudaEventRecord(ch.done, ch.stream));
  if (waits_used_ >= 4096) pending_wait_ms_ += TakeRecvWaitMs();  // nobody is collecting
  if (waits_used_ == waits_.size()) {
    std::pair<cudaEvent_t, cudaEvent_t> e;
    LT_CUDA_CHECK(cudaEventCreate(&e.first));
    LT_CUDA_CHECK(cudaEventCreate(&e.second));
    waits_.push_back(e);
  }
  const auto [wait_start, wait_end] = waits_[waits_used_++];
  LT_CUDA_CHECK(cudaEventRecord(wait_start, s));
  LT_CUDA_CHECK(cudaStreamWaitEvent(s, ch.done, 0));
  LT_CUDA_CHECK(cudaEventRecord(wait_end, s));
  runtime_->Track(ch.stream, "Recv", ch.name);
}

double NcclCommunicator::TakeRecvWaitMs() {
  double total = pending_wait_ms_;
  pending_wait_ms_ = 0.0;
  for (size_t i = 0; i < waits_used_; ++i) {
    LT_CUDA_CHECK(cudaEventSynchronize(waits_[i].second));
    float ms = 0.0f;
    LT_CUDA_CHECK(cudaEventElapsedTime(&ms, waits_[i].first, waits_[i].second));
    total += ms;
  }
  waits_used_ = 0;
  return total;
}

void NcclCommunicator::WaitSends(cudaStream_t s) {
  for (auto& [peer, ch] : send_) {
    LT_CUDA_CHECK(cudaEventRecord(ch->done, ch->stream));
    LT_CUDA_CHECK(cudaStreamWaitEvent(s, ch->done, 0));
  }
}

// Communicator interface: MainStream(), host or device memory.

void NcclCommunicator::AnyAllReduce(void* data, size_t n, CommType t, ReduceOp op) {
  if (n == 0 || size() == 1) return;
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  AllReduce(staging.Map(data, n * TypeBytes(t), true, true), n, t, s, op);
  staging.Finish();
}

void NcclCommunicator::AllReduceSum(float* data, size_t n) {
  AnyAllReduce(data, n, CommType::kF32, ReduceOp::kSum);
}

void NcclCommunicator::AllReduceMax(float* data, size_t n) {
  AnyAllReduce(data, n, CommType::kF32, ReduceOp::kMax);
}

void NcclCommunicator::AllReduceSumDouble(double* data, size_t n) {
  AnyAllReduce(data, n, CommType::kF64, ReduceOp::kSum);
}

void NcclCommunicator::AllReduceSumMany(const std::vector<std::pair<float*, size_t>>& arrays) {
  if (size() == 1) return;
  for (const auto& [data, n] : arrays) {
    if (n > 0 && !OnDevice(data)) {
      Communicator::AllReduceSumMany(arrays);  // host memory: one staged call each
      return;
    }
  }
  const cudaStream_t s = cuda::MainStream();
  constexpr size_t kPerGroup = 256;
  for (size_t first = 0; first < arrays.size(); first += kPerGroup) {
    const size_t last = std::min(arrays.size(), first + kPerGroup);
    Enqueue("AllReduceSumMany", s, [&](ncclComm_t comm) {
      ncclResult_t r = ncclGroupStart();
      for (size_t i = first; i < last && r == ncclSuccess; ++i) {
        if (arrays[i].second == 0) continue;
        r = ncclAllReduce(arrays[i].first, arrays[i].first, arrays[i].second, ncclFloat32, ncclSum,
                          comm, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
}

void NcclCommunicator::AllGather(const float* in, float* out, size_t n) {
  if (n == 0) return;
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  const size_t bytes = n * sizeof(float);
  const void* src = staging.Map(in, bytes, true, false);
  AllGather(src, staging.Map(out, bytes * size(), false, true), n, CommType::kF32, s);
  staging.Finish();
}

void NcclCommunicator::ReduceScatter(const float* in, float* out, size_t n) {
  if (n == 0) return;
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  const size_t bytes = n * sizeof(float);
  const void* src = staging.Map(in, bytes * size(), true, false);
  ReduceScatter(src, staging.Map(out, bytes, false, true), n, CommType::kF32, s);
  staging.Finish();
}

void NcclCommunicator::Broadcast(float* data, size_t n, int root) {
  if (root < 0 || root >= size()) Misuse(absl::StrCat("Broadcast root ", root, " on ", name_));
  if (n == 0 || size() == 1) return;
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  Broadcast(staging.Map(data, n * sizeof(float), true, true), n, CommType::kF32, root, s);
  staging.Finish();
}

void NcclCommunicator::SendAsync(const float* data, size_t n, int peer, uint32_t) {
  // The copy into the staging buffer reads `data` in stream order (host memory: before the call
  // returns), so the caller may reuse it at once.
  Send(data, n, CommType::kF32, peer, cuda::MainStream());
}

void NcclCommunicator::Recv(float* data, size_t n, int peer, uint32_t) {
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  RecvRaw(staging.Map(data, n * sizeof(float), false, true), n, CommType::kF32, peer, s);
  staging.Finish();
}

void NcclCommunicator::WaitSends() { WaitSends(cuda::MainStream()); }

void NcclCommunicator::Barrier() {
  if (size() == 1) return;
  const cudaStream_t s = cuda::MainStream();
  float* buf = static_cast<float*>(runtime_->scratch());
  runtime_->Call(comm_, "Barrier", name_,
                 [&] { return ncclAllReduce(buf, buf, 1, ncclFloat32, ncclMax, comm_, s); });
  runtime_->Track(s, "Barrier", name_);
  LT_CUDA_CHECK(cudaStreamSynchronize(s));
}

NcclCommunicator* AsNccl(Communicator* c) { return dynamic_cast<NcclCommunicator*>(c); }

// ---------------------------------------------------------------------------------------------

absl::StatusOr<ProcessGroups> CreateNcclProcessGroups(const LaunchInfo& launch,
                                                      const ParallelSizes& sizes) {
  if (launch.world_size != sizes.world()) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", launch.world_size, " is not TP ",
                                                   sizes.tp, " x PP ", sizes.pp, " x DP ",
                                                   sizes.dp));
  }
  if (launch.rank < 0 || launch.rank >= launch.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", launch.rank, " is outside world size ", launch.world_size));
  }
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", launch.rank, ": no CUDA device (",
                     e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  const int device = launch.local_rank % count;
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", launch.rank, ": cudaSetDevice(",
                                                      device, "): ", cudaGetErrorString(e)));
  }
  int stream_device = device;
  if (cudaStreamGetDevice(cuda::MainStream(), &stream_device) == cudaSuccess &&
      stream_device != device) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", launch.rank, ": the CUDA main stream belongs to device ",
                     stream_device, ", not this rank's device ", device,
                     " (call CreateNcclProcessGroups before any other CUDA work)"));
  }
  auto runtime = std::make_shared<NcclRuntime>(launch, device);

  ProcessGroups g;
  g.sizes = sizes;
  g.world_rank = launch.rank;
  g.coords = CoordsOf(launch.rank, sizes);
  const RankCoords c = g.coords;
  // comm_gloo's groups: members in group-rank order, keyed by what they share.
  struct Group {
    std::string key;
    std::vector<int> members;
    std::unique_ptr<Communicator>* slot;
    int rank = -1;
    ncclComm_t comm = nullptr;
  };
  std::vector<Group> groups;
  {
    const GroupMembers m = MembersOf(c, sizes);
    groups.push_back({"world", m.world, &g.world});
    groups.push_back({absl::StrCat("tp-", c.dp, "-", c.pp), m.tp, &g.tp});
    groups.push_back({absl::StrCat("dp-", c.tp, "-", c.pp), m.dp, &g.dp});
    groups.push_back({absl::StrCat("pp-", c.tp, "-", c.dp), m.pp, &g.pp});
    groups.push_back({absl::StrCat("mp-", c.dp), m.model, &g.model});
    if (sizes.pp > 1 && (c.pp == 0 || c.pp == sizes.pp - 1)) {
      groups.push_back({absl::StrCat("emb-", c.tp, "-", c.dp), m.embedding, &g.embedding});
    }
  }
  for (Group& grp : groups) {
    grp.rank = static_cast<int>(std::find(grp.members.begin(), grp.members.end(), launch.rank) -
                                grp.members.begin());
  }
  // Point-to-point channels made now: both directions between ring neighbours of the pipeline
  // group, edge by edge in group order (the same order on every rank of the group).
  const Group& pp = groups[3];
  std::vector<std::pair<int, int>> channel_pairs;  // (from, to) world ranks
  {
    const int stages = static_cast<int>(pp.members.size());
    std::set<std::pair<int, int>> seen;
    for (int e = 0; stages > 1 && e < stages; ++e) {
      const int a = pp.members[e], b = pp.members[(e + 1) % stages];
      if (!seen.insert({std::min(a, b), std::max(a, b)}).second) continue;
      if (a != launch.rank && b != launch.rank) continue;
      channel_pairs.push_back({std::min(a, b), std::max(a, b)});
      channel_pairs.push_back({std::max(a, b), std::min(a, b)});
    }
  }

  if (sizes.world() > 1) {
    if (absl::Status s = runtime->Rendezvous(); !s.ok()) return s;
    // Ids first (this rank creates those of the groups it is the lowest rank of, and of its
    // outgoing channels), so no rank waits for an id while holding one back.
    for (const Group& grp : groups) {
      if (grp.members.size() > 1 &&
          *std::min_element(grp.members.begin(), grp.members.end()) == launch.rank) {
        if (absl::Status s = runtime->PublishId(grp.key); !s.ok()) return s;
      }
    }
    for (const auto& [from, to] : channel_pairs) {
      if (from != launch.rank) continue;
      if (absl::Status s = runtime->PublishId(ChannelKey(pp.key, from, to)); !s.ok()) return s;
    }
    std::vector<std::pair<ncclComm_t, std::string>> comms;
    for (Group& grp : groups) {
      if (grp.members.size() == 1) continue;
      absl::StatusOr<ncclComm_t> comm =
          runtime->CreateComm(grp.key, static_cast<int>(grp.members.size()), grp.rank);
      if (!comm.ok()) return comm.status();
      grp.comm = *comm;
      comms.push_back({grp.comm, grp.key});
    }
    std::vector<NcclChannel*> channels;
    for (const auto& [from, to] : channel_pairs) {
      absl::StatusOr<NcclChannel*> ch = runtime->CreateChannel(pp.key, from, to);
      if (!ch.ok()) return ch.status();
      channels.push_back(*ch);
    }
    runtime->WarmUp(comms, channels);
  }
  for (Group& grp : groups) {
    *grp.slot =
        std::make_unique<NcclCommunicator>(runtime, grp.key, grp.members, grp.rank, grp.comm);
  }
  runtime->SetInitialized();
  EndRendezvousPhase();
  return g;
}

}  // namespace leantron::trainer
