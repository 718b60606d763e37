// Gloo communicators: one full-mesh TCP context per process group, all rendezvousing through one
// file store (each group under its own key prefix).
#include "trainer/dist/comm_gloo.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "trainer/dist/rendezvous_signals.h"
#include "trainer/dist/tcp_store.h"

namespace leantron::trainer {
namespace {

constexpr uint32_t kP2pSlot = 0x7e000;

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, size_t) override {}
  void AllReduceMax(float*, size_t) override {}
  void AllReduceSumDouble(double*, size_t) override {}
  void AllGather(const float* in, float* out, size_t n) override {
    if (in != out) std::memmove(out, in, n * sizeof(float));
  }
  void ReduceScatter(const float* in, float* out, size_t n) override {
    if (in != out) std::memmove(out, in, n * sizeof(float));
  }
  void AllToAll(const float* in, float* out, size_t n) override {
    std::memcpy(out, in, n * sizeof(float));
  }
  void Broadcast(float*, size_t, int) override {}
  void Broadcast16(uint16_t*, size_t, int) override {}
  // A group of one has no peer; a schedule never sends to itself.
  void SendAsync(const float*, size_t, int, uint32_t) override { std::abort(); }
  void Recv(float*, size_t, int, uint32_t) override { std::abort(); }
  void WaitSends() override {}
  void Barrier() override {}
};

// Gloo reports a peer that died or a broken connection by exception, from deep inside the
// training step, where nothing could do more than abort; so the rank ends here, with one line
// naming itself and the operation, and a non-zero exit.
[[noreturn]] void PeerLost(int world_rank, const char* op, int group_size, const char* what) {
  std::fprintf(stderr,
               "error (rank %d): %s in a group of %d ranks failed: %s (another rank died or the "
               "network failed)\n",
               world_rank, op, group_size, what);
  std::fflush(stderr);
  ::_exit(1);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int world_rank)
      : context_(std::move(context)), world_rank_(world_rank) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  void AllReduceSum(float* data, size_t n) override {
    Guard("all-reduce", [&] { AllReduce<float>(data, n, false); });
  }
  void AllReduceMax(float* data, size_t n) override {
    Guard("all-reduce", [&] { AllReduce<float>(data, n, true); });
  }
  void AllReduceSumDouble(double* data, size_t n) override {
    Guard("all-reduce", [&] { AllReduce<double>(data, n, false); });
  }

  void AllGather(const float* in, float* out, size_t n) override {
    if (n == 0) return;
    std::vector<float> input(in, in + n);  // `in` may alias `out`
    gloo::AllgatherOptions opts(context_);
    opts.setInput(input.data(), n);
    opts.setOutput(out, n * size());
    Guard("all-gather", [&] { gloo::allgather(opts); });
  }

  // Gloo has no new-style reduce-scatter; an all-reduce and a slice give the same sums (every
  // rank reduces in the same ring order), at twice the traffic. The NCCL backend does it natively.
  void ReduceScatter(const float* in, float* out, size_t n) override {
    std::vector<float> all(in, in + n * size());
    AllReduceSum(all.data(), all.size());
    std::memcpy(out, all.data() + n * rank(), n * sizeof(float));
  }

  void AllToAll(const float* in, float* out, size_t n) override {
    if (n == 0) return;
    gloo::AlltoallOptions opts(context_);
    opts.setInput(const_cast<float*>(in), n * size());
    opts.setOutput(out, n * size());
    Guard("all-to-all", [&] { gloo::alltoall(opts); });
  }
  void Broadcast(float* data, size_t n, int root) override { AnyBroadcast(data, n, root); }
  void Broadcast16(uint16_t* data, size_t n, int root) override { AnyBroadcast(data, n, root); }
  template <typename T>
  void AnyBroadcast(T* data, size_t n, int root) {
    if (n == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, n);
    opts.setRoot(root);
    Guard("broadcast", [&] { gloo::broadcast(opts); });
  }

  void SendAsync(const float* data, size_t n, int peer, uint32_t tag) override {
    Pending& pending = pending_.emplace_back();
    pending.data.assign(data, data + n);
    Guard("send", [&] {
      pending.buffer = context_->createUnboundBuffer(pending.data.data(), n * sizeof(float));
      pending.buffer->send(peer, kP2pSlot + tag);
    });
  }
  void Recv(float* data, size_t n, int peer, uint32_t tag) override {
    Guard("receive", [&] {
      auto buf = context_->createUnboundBuffer(data, n * sizeof(float));
      buf->recv(peer, kP2pSlot + tag);
      buf->waitRecv();
    });
  }
  void WaitSends() override {
    Guard("send", [&] {
      for (Pending& p : pending_) p.buffer->waitSend();
    });
    pending_.clear();
  }
  void Barrier() override {
    gloo::BarrierOptions opts(context_);
    Guard("barrier", [&] { gloo::barrier(opts); });
  }

 private:
  template <typename F>
  void Guard(const char* op, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      PeerLost(world_rank_, op, size(), e.what());
    }
  }
  template <typename T>
  void AllReduce(T* data, size_t n, bool max) {
    if (n == 0) return;
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    using Fn = void (*)(void*, const void*, const void*, size_t);
    opts.setReduceFunction(max ? static_cast<Fn>(&gloo::max<T>) : static_cast<Fn>(&gloo::sum<T>));
    gloo::allreduce(opts);
  }
  std::shared_ptr<gloo::Context> context_;
  int world_rank_ = 0;
  struct Pending {
    std::vector<float> data;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  };
  std::deque<Pending> pending_;  // a deque: elements stay put while their send is in flight
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::atoi(v) : fallback;
}

}  // namespace

namespace {
class TimedCommunicator final : public Communicator {
 public:
  TimedCommunicator(std::unique_ptr<Communicator> inner, double* seconds)
      : inner_(std::move(inner)), seconds_(seconds) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void AllReduceSum(float* d, size_t n) override {
    Time([&] { inner_->AllReduceSum(d, n); });
  }
  void AllReduceMax(float* d, size_t n) override {
    Time([&] { inner_->AllReduceMax(d, n); });
  }
  void AllReduceSumDouble(double* d, size_t n) override {
    Time([&] { inner_->AllReduceSumDouble(d, n); });
  }
  void AllGather(const float* in, float* out, size_t n) override {
    Time([&] { inner_->AllGather(in, out, n); });
  }
  void ReduceScatter(const float* in, float* out, size_t n) override {
    Time([&] { inner_->ReduceScatter(in, out, n); });
  }
  void AllToAll(const float* in, float* out, size_t n) override {
    Time([&] { inner_->AllToAll(in, out, n); });
  }
  void Broadcast(float* d, size_t n, int root) override {
    Time([&] { inner_->Broadcast(d, n, root); });
  }
  void Broadcast16(uint16_t* d, size_t n, int root) override {
    Time([&] { inner_->Broadcast16(d, n, root); });
  }
  void SendAsync(const float* d, size_t n, int peer, uint32_t tag) override {
    Time([&] { inner_->SendAsync(d, n, peer, tag); });
  }
  void Recv(float* d, size_t n, int peer, uint32_t tag) override {
    Time([&] { inner_->Recv(d, n, peer, tag); });
  }
  void WaitSends() override {
    Time([&] { inner_->WaitSends(); });
  }
  void Barrier() override {
    Time([&] { inner_->Barrier(); });
  }

 private:
  template <typename F>
  void Time(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::unique_ptr<Communicator> inner_;
  double* seconds_;
};

}  // namespace

std::unique_ptr<Communicator> MakeTimedCommunicator(std::unique_ptr<Communicator> inner,
                                                    double* seconds) {
  return std::make_unique<TimedCommunicator>(std::move(inner), seconds);
}

std::unique_ptr<Communicator> MakeSelfCommunicator() {
  return std::make_unique<SelfCommunicator>();
}

LaunchInfo LaunchInfoFromEnvironment() {
  LaunchInfo info;
  if (std::getenv("RANK") != nullptr) {
    info.rank = EnvInt("RANK", 0);
    info.world_size = EnvInt("WORLD_SIZE", 1);
    info.local_rank = EnvInt("LOCAL_RANK", info.rank);
    info.local_world_size = EnvInt("LOCAL_WORLD_SIZE", info.world_size);
  } else if (std::getenv("SLURM_PROCID") != nullptr) {
    info.rank = EnvInt("SLURM_PROCID", 0);
    info.world_size = EnvInt("SLURM_NTASKS", 1);
    info.local_rank = EnvInt("SLURM_LOCALID", 0);
    // "4" or "4(x2)": the leading count.
    info.local_world_size = EnvInt("SLURM_NTASKS_PER_NODE", info.world_size);
  } else if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    info.rank = EnvInt("OMPI_COMM_WORLD_RANK", 0);
    info.world_size = EnvInt("OMPI_COMM_WORLD_SIZE", 1);
    info.local_rank = EnvInt("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.local_world_size = EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", info.world_size);
  }
  info.local_world_size = std::max(1, info.local_world_size);
  if (const char* a = std::getenv("MASTER_ADDR")) info.master_addr = a;
  info.master_port = EnvInt("MASTER_PORT", 29500);
  if (const char* d = std::getenv("LEANTRON_RENDEZVOUS_DIR")) info.rendezvous_dir = d;
  if (const char* h = std::getenv("LEANTRON_GLOO_HOSTNAME")) info.gloo_hostname = h;
  if (const char* t = std::getenv("LEANTRON_JOB_TOKEN"); t != nullptr && *t != '\0') {
    info.job_token = t;
  } else {
    for (const char* name : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                             "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
      if (const char* v = std::getenv(name)) absl::StrAppend(&info.job_token, name, "=", v, ";");
    }
  }
  return info;
}

absl::StatusOr<ProcessGroups> CreateProcessGroups(const LaunchInfo& launch,
                                                  const ParallelSizes& sizes,
                                                  const DistOptions& options) {
  ProcessGroups g;
  g.sizes = sizes;
  g.world_rank = launch.rank;
  g.coords = CoordsOf(launch.rank, sizes);
  if (launch.world_size != sizes.world()) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", launch.world_size, " is not TP ",
                                                   sizes.tp, " x CP ", sizes.cp, " x PP ", sizes.pp,
                                                   " x DP ", sizes.dp));
  }
  if (sizes.world() == 1) {
    EndRendezvousPhase();
    return SingleProcessGroups();
  }
  try {
    const auto timeout = std::chrono::seconds(options.timeout_s);
    // Rendezvous: a directory every rank sees (train --nproc-per-node makes one), else a TCP
    // store served by rank 0 on MASTER_ADDR:MASTER_PORT.
    std::unique_ptr<gloo::rendezvous::Store> owned_store;
    std::unique_ptr<TcpStoreServer> server;
    if (!launch.rendezvous_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(launch.rendezvous_dir, ec);
      if (ec) {
        return absl::UnavailableError(
            absl::StrCat("cannot create rendezvous directory ", launch.rendezvous_dir));
      }
      owned_store = std::make_unique<gloo::rendezvous::FileStore>(launch.rendezvous_dir);
    } else {
      if (launch.rank == 0) {
        absl::StatusOr<std::unique_ptr<TcpStoreServer>> s = TcpStoreServer::Start(launch);
        if (!s.ok()) return s.status();
        server = std::move(*s);
      }
      absl::StatusOr<std::unique_ptr<TcpStore>> c = TcpStore::Connect(launch, timeout, timeout);
      if (!c.ok()) return c.status();
      owned_store = std::move(*c);
    }
    gloo::rendezvous::Store& store = *owned_store;
    gloo::transport::tcp::attr attr;
    attr.hostname = !launch.gloo_hostname.empty() ? launch.gloo_hostname
                    : launch.master_addr == "127.0.0.1" || launch.master_addr == "localhost"
                        ? "127.0.0.1"
                        : "";
    if (attr.hostname.empty()) {
      char name[256] = {0};
      gethostname(name, sizeof(name) - 1);
      attr.hostname = name;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);

    // Connects the group `members` (world ranks, in group-rank order) under `key` if this rank
    // is a member.
    auto connect = [&](const std::string& key,
                       const std::vector<int>& members) -> std::unique_ptr<Communicator> {
      int my = -1;
      for (size_t i = 0; i < members.size(); ++i)
        if (members[i] == launch.rank) my = static_cast<int>(i);
      if (my < 0) return nullptr;
      if (members.size() == 1) return MakeSelfCommunicator();
      gloo::rendezvous::PrefixStore prefixed(key, store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(my, static_cast<int>(members.size()));
      ctx->setTimeout(timeout);
      ctx->connectFullMesh(prefixed, device);
      return std::make_unique<GlooCommunicator>(std::move(ctx), launch.rank);
    };
    for (const GroupSpec& spec : GroupsOf(g.coords, sizes)) {
      g.*spec.slot = connect(spec.key + "/", spec.members);
    }
    // Rank 0 serves the store until every rank is done with it; a rendezvous folder goes as soon
    // as every rank is done with it, so that nothing is left even if the launcher is killed.
    store.set(absl::StrCat("done/", launch.rank), {'1'});
    if (launch.rank == 0) {
      std::vector<std::string> done;
      for (int r = 0; r < sizes.world(); ++r) done.push_back(absl::StrCat("done/", r));
      store.wait(done, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      if (!launch.rendezvous_dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(launch.rendezvous_dir, ec);
      }
    }
    EndRendezvousPhase();
    return g;
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous failed: ", e.what()));
  }
}

}  // namespace leantron::trainer
