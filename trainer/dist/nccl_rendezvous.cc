// The rendezvous of the NCCL backend: rank 0's store, the barrier every rank passes, NCCL ids
// published there, communicators and point-to-point channels created and connected.
#include <algorithm>
#include <cstring>
#include <exception>

#include "trainer/dist/nccl_runtime.h"

namespace leantron::trainer {

using namespace nccl_detail;

absl::Status NcclRuntime::Rendezvous() {
  const std::string where = StoreAddress();
  const long long limit = SecondsOf(rendezvous_timeout_);
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(rendezvous_timeout_);
  if (rank() == 0) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> s = TcpStoreServer::Start(launch_);
    if (!s.ok()) return s.status();
    server_ = std::move(*s);
  }
  absl::StatusOr<std::unique_ptr<TcpStore>> c = TcpStore::Connect(launch_, timeout, timeout);
  if (!c.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank(), " could not reach the rendezvous store at ", where, " within ", limit,
        " s (--rendezvous-timeout-seconds; is rank 0 running, are MASTER_ADDR/MASTER_PORT "
        "right?): ",
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
                           limit, " s (--rendezvous-timeout-seconds)"));
        }
      }
      store_->set("abort", {});
      store_->set("ready", Bytes("1"));
    }
    store_->get("ready");
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank(), ": the rendezvous at ", where, " did not complete within ", limit,
        " s (--rendezvous-timeout-seconds; a rank never arrived, or rank 0 is gone): ", e.what()));
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
        SecondsOf(rendezvous_timeout_), " s (--rendezvous-timeout-seconds): ", e.what()));
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
  config.blocking = 0;
  config.commName = comm_names_.emplace_back(key).c_str();
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
                       " s (--rendezvous-timeout-seconds)"));
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

}  // namespace leantron::trainer
