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
#include "trainer/dist/nccl_runtime.h"

namespace leantron::trainer {

using namespace nccl_detail;

namespace {

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

}  // namespace

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

void NcclCommunicator::AllToAll(const float* in, float* out, size_t n) {
  if (n == 0) return;
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  const size_t bytes = n * sizeof(float) * size();
  const float* src = static_cast<const float*>(staging.Map(in, bytes, true, false));
  float* dst = static_cast<float*>(staging.Map(out, bytes, false, true));
  if (size() == 1) {
    LT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  } else {
    // NCCL's all-to-all is its grouped sends and receives, one pair per peer.
    Enqueue("AllToAll", s, [&](ncclComm_t comm) {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        r = ncclSend(src + p * n, n, ncclFloat32, p, comm, s);
        if (r == ncclSuccess) r = ncclRecv(dst + p * n, n, ncclFloat32, p, comm, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  staging.Finish();
}

void NcclCommunicator::StagedBroadcast(void* data, size_t n, size_t bytes, CommType t, int root) {
  if (root < 0 || root >= size()) Misuse(absl::StrCat("Broadcast root ", root, " on ", name_));
  if (n == 0 || size() == 1) return;
  const cudaStream_t s = cuda::MainStream();
  HostStaging staging(s);
  Broadcast(staging.Map(data, n * bytes, true, true), n, t, root, s);
  staging.Finish();
}

void NcclCommunicator::Broadcast(float* data, size_t n, int root) {
  StagedBroadcast(data, n, sizeof(float), CommType::kF32, root);
}

void NcclCommunicator::Broadcast16(uint16_t* data, size_t n, int root) {
  StagedBroadcast(data, n, sizeof(uint16_t), CommType::kBF16, root);
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

}  // namespace leantron::trainer
