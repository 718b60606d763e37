// The NCCL backend across forked ranks, one GPU each (N = min(GPUs, 4), skipped below 2): every
// collective of every process group on awkward sizes against host-computed results (float through
// the Communicator interface, bf16 and f64 through the typed entry points on a stream of the
// test's own, host-memory pointers as the trainer passes them), point-to-point rings with two tags
// in order, and a rank dying mid-run: the others must stop with the watchdog's message instead of
// hanging; and the copy-engine exchange between the ranks of a group (PeerExchange: a ring of
// rounds that reuse its two inbox slots, bursts of sends ahead of the receives, a receive that
// adds the block where it arrived). The test process forks the ranks before it touches CUDA.
#include "trainer/dist/nccl_comm.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "libckpt/dtype.h"
#include "trainer/comm.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/grad_reduce.h"
#include "trainer/cuda/kernels.h"
#include "trainer/cuda/peer_exchange.h"

namespace leantron::trainer {
namespace {

using cuda::MainStream;

// ---- parent side: ranks as child processes ---------------------------------------------------

// Counted in a child: a process that has initialised CUDA must not fork ranks that use it.
int DeviceCount() {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(std::min(n, 100));
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

int FreePort() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  const int zero = 0;
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_in6 addr = {};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin6_port);
  }
  close(fd);
  return port;
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  std::string log;  // the child's stderr
  bool done = false, exited = false;
  int code = -1;  // exit code, or the signal when !exited
  double seconds = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Forks `n` ranks running body(rank) with a launcher's environment; each one's stderr goes to
// <dir>/rank<r>.log.
std::vector<Child> LaunchRanks(int n, int port, const std::string& dir,
                               const std::function<int(int)>& body) {
  std::vector<Child> children(n);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < n; ++r) {
    children[r].rank = r;
    children[r].log = dir + "/rank" + std::to_string(r) + ".log";
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(children[r].log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      unsetenv("LEANTRON_RENDEZVOUS_DIR");
      int code = 1;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: exception: %s\n", r, e.what());
      }
      std::fflush(stderr);
      _exit(code);
    }
    children[r].pid = pid;
  }
  return children;
}

// Waits for every child until `limit_s`; stragglers are SIGKILLed (and reported as not exited).
void WaitAll(std::vector<Child>& children, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  size_t left = children.size();
  while (left > 0) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (Child& c : children) {
      if (c.done || c.pid <= 0) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.done = true;
        c.exited = WIFEXITED(status);
        c.code = c.exited ? WEXITSTATUS(status) : WTERMSIG(status);
        c.seconds = elapsed;
        --left;
      }
    }
    if (left == 0) break;
    if (elapsed > limit_s) {
      for (Child& c : children) {
        if (c.done || c.pid <= 0) continue;
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
        c.done = true;
        c.exited = false;
        c.code = SIGKILL;
        c.seconds = elapsed;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string TempDir() {
  char tmpl[] = "/tmp/nccl_comm_test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d != nullptr ? d : "/tmp";
}

// ---- child side ------------------------------------------------------------------------------

// Small integers: every sum below is exact in float (and in bf16), whatever NCCL's order.
float Value(int world_rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + world_rank * 13) % 31) - 15);
}
float SmallValue(int world_rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 5 + world_rank * 3) % 9) - 4);
}
// Exact for the small integers above (their low 16 bits are zero).
uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Stream-ordered device memory: cudaFree would wait for the whole device, sends still waiting for
// their receivers included, and a ring of ranks doing that deadlocks. Buffers used on another
// stream are downloaded (that stream synchronised) before they go.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) {
    LT_CUDA_CHECK(cudaMallocAsync(&ptr_, std::max<size_t>(n, 1) * sizeof(T), MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  }
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) { Upload(h); }
  ~DeviceBuffer() { (void)cudaFreeAsync(ptr_, MainStream()); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  void Upload(const std::vector<T>& h, cudaStream_t s = MainStream()) {
    LT_CUDA_CHECK(cudaMemcpyAsync(ptr_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, s));
    LT_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  std::vector<T> Download(size_t n, cudaStream_t s = MainStream()) const {
    std::vector<T> h(n);
    LT_CUDA_CHECK(cudaMemcpyAsync(h.data(), ptr_, n * sizeof(T), cudaMemcpyDeviceToHost, s));
    LT_CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
  }

 private:
  T* ptr_ = nullptr;
};

struct Checker {
  int world_rank = 0;
  int failures = 0;
  void Expect(bool ok, const std::string& what) {
    if (ok) return;
    if (++failures <= 30) std::fprintf(stderr, "rank %d: FAILED %s\n", world_rank, what.c_str());
  }
  template <typename T>
  void Equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    if (got.size() != want.size()) {
      Expect(false,
             what + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(got[i] == want[i])) {
        std::ostringstream os;
        os << what << ": element " << i << " of " << got.size() << " is " << got[i] << ", expected "
           << want[i];
        Expect(false, os.str());
        return;
      }
    }
  }
};

std::vector<float> Fill(int world_rank, size_t n, float (*f)(int, size_t)) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f(world_rank, i);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16(v[i]);
  return out;
}

std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FromBf16(v[i]);
  return out;
}

// Every collective of one group.
void CheckCollectives(const std::string& name, Communicator* comm, const std::vector<int>& members,
                      int world_rank, cudaStream_t user, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  c.Expect(nc != nullptr, name + ": not an NcclCommunicator");
  if (nc == nullptr) return;
  const int size = comm->size(), me = comm->rank();
  c.Expect(size == static_cast<int>(members.size()), name + ": size");
  c.Expect(me >= 0 && me < size && members[me] == world_rank, name + ": rank");
  c.Expect(nc->members() == members, name + ": members");
  c.Expect((nc->comm() == nullptr) == (size == 1),
           name + ": comm() for size " + std::to_string(size));
  if (size != static_cast<int>(members.size()) || me < 0 || me >= size) return;

  for (size_t n : {size_t{1}, size_t{7}, size_t{4097}, size_t{(1u << 20) + 3}}) {
    const std::string tag = name + " n=" + std::to_string(n);
    std::vector<float> sum(n, 0.0f), max(n, -1e30f);
    for (int m : members) {
      for (size_t i = 0; i < n; ++i) {
        sum[i] += Value(m, i);
        max[i] = std::max(max[i], Value(m, i));
      }
    }
    DeviceBuffer<float> d(Fill(world_rank, n, Value));
    comm->AllReduceSum(d.get(), n);
    c.Equal(d.Download(n), sum, tag + " AllReduceSum");
    d.Upload(Fill(world_rank, n, Value));
    comm->AllReduceMax(d.get(), n);
    c.Equal(d.Download(n), max, tag + " AllReduceMax");
  }

  // Host memory, as the trainer passes flags and loss sums.
  {
    std::vector<float> flags = {static_cast<float>(world_rank), -static_cast<float>(world_rank)};
    comm->AllReduceMax(flags.data(), flags.size());
    const int hi = *std::max_element(members.begin(), members.end());
    const int lo = *std::min_element(members.begin(), members.end());
    c.Equal(flags, {static_cast<float>(hi), -static_cast<float>(lo)}, name + " host AllReduceMax");
    std::vector<double> sums = {world_rank + 0.5, 2.0 * world_rank, 1.0};
    comm->AllReduceSumDouble(sums.data(), sums.size());
    std::vector<double> want = {0, 0, static_cast<double>(size)};
    for (int m : members) {
      want[0] += m + 0.5;
      want[1] += 2.0 * m;
    }
    c.Equal(sums, want, name + " host AllReduceSumDouble");
    std::vector<float> hsum = Fill(world_rank, 5, Value);
    comm->AllReduceSum(hsum.data(), hsum.size());
    std::vector<float> hwant(5, 0.0f);
    for (int m : members)
      for (size_t i = 0; i < 5; ++i) hwant[i] += Value(m, i);
    c.Equal(hsum, hwant, name + " host AllReduceSum");
  }

  // AllGather: out of place, in == out, NCCL's in-place layout, host memory.
  {
    const size_t n = 1001;
    std::vector<float> want(size * n);
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < n; ++i) want[j * n + i] = Value(members[j], i);
    const std::vector<float> mine = Fill(world_rank, n, Value);
    DeviceBuffer<float> in(mine), out(size * n);
    comm->AllGather(in.get(), out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllGather");
    std::vector<float> start(size * n, -99.0f);
    std::copy(mine.begin(), mine.end(), start.begin());
    out.Upload(start);
    comm->AllGather(out.get(), out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllGather in == out");
    std::fill(start.begin(), start.end(), -99.0f);
    std::copy(mine.begin(), mine.end(), start.begin() + me * n);
    out.Upload(start);
    comm->AllGather(out.get() + me * n, out.get(), n);
    c.Equal(out.Download(size * n), want, name + " AllGather in place");
    std::vector<float> host_out(size * n, -99.0f);
    comm->AllGather(mine.data(), host_out.data(), n);
    c.Equal(host_out, want, name + " host AllGather");
  }

  // ReduceScatter: out of place, out == in, NCCL's in-place layout.
  {
    const size_t n = 999;
    std::vector<float> want(n, 0.0f);
    for (int m : members)
      for (size_t i = 0; i < n; ++i) want[i] += Value(m, me * n + i);
    const std::vector<float> all = Fill(world_rank, size * n, Value);
    DeviceBuffer<float> in(all), out(n);
    comm->ReduceScatter(in.get(), out.get(), n);
    c.Equal(out.Download(n), want, name + " ReduceScatter");
    comm->ReduceScatter(in.get(), in.get(), n);
    c.Equal(in.Download(n), want, name + " ReduceScatter out == in");
    in.Upload(all);
    comm->ReduceScatter(in.get(), in.get() + me * n, n);
    std::vector<float> got = in.Download(size * n);
    c.Equal(std::vector<float>(got.begin() + me * n, got.begin() + (me + 1) * n), want,
            name + " ReduceScatter in place");
  }

  // Broadcast from the last and the first rank.
  for (int root : {size - 1, 0}) {
    const size_t n = 3001;
    DeviceBuffer<float> d(Fill(world_rank, n, Value));
    comm->Broadcast(d.get(), n, root);
    c.Equal(d.Download(n), Fill(members[root], n, Value),
            name + " Broadcast root " + std::to_string(root));
  }

  // Typed entry points on the test's own stream: bf16 and f64.
  {
    const size_t n = 5003;
    std::vector<float> want(n, 0.0f), want_max(n, -1e30f);
    for (int m : members) {
      for (size_t i = 0; i < n; ++i) {
        want[i] += SmallValue(m, i);
        want_max[i] = std::max(want_max[i], SmallValue(m, i));
      }
    }
    const std::vector<uint16_t> mine = ToBf16(Fill(world_rank, n, SmallValue));
    DeviceBuffer<uint16_t> d(mine);
    nc->AllReduce(d.get(), n, CommType::kBF16, user);
    c.Equal(FromBf16(d.Download(n, user)), want, name + " bf16 AllReduce");
    d.Upload(mine, user);
    nc->AllReduce(d.get(), n, CommType::kBF16, user, ReduceOp::kMax);
    c.Equal(FromBf16(d.Download(n, user)), want_max, name + " bf16 AllReduce max");

    const size_t g = 777;
    std::vector<float> gathered(size * g);
    for (int j = 0; j < size; ++j)
      for (size_t i = 0; i < g; ++i) gathered[j * g + i] = SmallValue(members[j], i);
    DeviceBuffer<uint16_t> gin(ToBf16(Fill(world_rank, g, SmallValue))), gout(size * g);
    nc->AllGather(gin.get(), gout.get(), g, CommType::kBF16, user);
    c.Equal(FromBf16(gout.Download(size * g, user)), gathered, name + " bf16 AllGather");

    const size_t r = 333;
    std::vector<float> scattered(r, 0.0f);
    for (int m : members)
      for (size_t i = 0; i < r; ++i) scattered[i] += SmallValue(m, me * r + i);
    DeviceBuffer<uint16_t> rin(ToBf16(Fill(world_rank, size * r, SmallValue))), rout(r);
    nc->ReduceScatter(rin.get(), rout.get(), r, CommType::kBF16, user);
    c.Equal(FromBf16(rout.Download(r, user)), scattered, name + " bf16 ReduceScatter");

    const size_t f = 17;
    std::vector<double> dv(f), dwant(f, 0.0);
    for (size_t i = 0; i < f; ++i) dv[i] = world_rank * 0.25 + static_cast<double>(i);
    for (int m : members)
      for (size_t i = 0; i < f; ++i) dwant[i] += m * 0.25 + static_cast<double>(i);
    DeviceBuffer<double> dd(dv);
    nc->AllReduce(dd.get(), f, CommType::kF64, user);
    c.Equal(dd.Download(f, user), dwant, name + " f64 AllReduce");
  }
  comm->Barrier();
}

float Message(int sender, int k, size_t i) {
  return static_cast<float>(sender * 1000 + k * 100 + static_cast<int>(i % 97));
}

// A ring: every rank sends three messages (tags 0, 1, 0) and a host-memory one (tag 1) to the
// next rank before receiving the previous rank's in the same order. The send buffer is rewritten
// right after each SendAsync: the receiver must still see what was sent.
void CheckRing(const std::string& name, Communicator* comm, int world_rank, cudaStream_t user,
               Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const int size = comm->size(), me = comm->rank();
  const int next = (me + 1) % size, prev = (me + size - 1) % size;
  const int from = nc->members()[prev];
  const size_t sizes[3] = {(1u << 20) + 5, 17, 4099};  // 4 MiB: beyond NCCL's staging buffers
  const uint32_t tags[3] = {0, 1, 0};
  DeviceBuffer<float> send(sizes[0]);
  for (int k = 0; k < 3; ++k) {
    std::vector<float> msg(sizes[k]);
    for (size_t i = 0; i < sizes[k]; ++i) msg[i] = Message(world_rank, k, i);
    send.Upload(msg);
    comm->SendAsync(send.get(), sizes[k], next, tags[k]);
    LT_CUDA_CHECK(cudaMemsetAsync(send.get(), 0, sizes[0] * sizeof(float), MainStream()));
  }
  std::vector<float> host_msg(5);
  for (size_t i = 0; i < host_msg.size(); ++i) host_msg[i] = Message(world_rank, 3, i);
  comm->SendAsync(host_msg.data(), host_msg.size(), next, 1);
  std::fill(host_msg.begin(), host_msg.end(), -1.0f);

  for (int k = 0; k < 3; ++k) {
    DeviceBuffer<float> recv(sizes[k]);
    comm->Recv(recv.get(), sizes[k], prev, tags[k]);
    std::vector<float> want(sizes[k]);
    for (size_t i = 0; i < sizes[k]; ++i) want[i] = Message(from, k, i);
    c.Equal(recv.Download(sizes[k]), want, name + " ring message " + std::to_string(k));
  }
  std::vector<float> host_recv(5, -7.0f), host_want(5);
  comm->Recv(host_recv.data(), host_recv.size(), prev, 1);
  for (size_t i = 0; i < host_want.size(); ++i) host_want[i] = Message(from, 3, i);
  c.Equal(host_recv, host_want, name + " ring host message");
  comm->WaitSends();

  // Typed: bf16 on the test's stream.
  const size_t n = 1234;
  std::vector<float> mine(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = SmallValue(world_rank, i);
    want[i] = SmallValue(from, i);
  }
  DeviceBuffer<uint16_t> out(ToBf16(mine)), in(n);
  nc->Send(out.get(), n, CommType::kBF16, next, user);
  nc->RecvRaw(in.get(), n, CommType::kBF16, prev, user);
  nc->WaitSends(user);
  c.Equal(FromBf16(in.Download(n, user)), want, name + " ring bf16");
}

// PeerExchange around the group's ring: `rounds` messages of awkward sizes up to the inbox's,
// sent in bursts of `burst` before they are received (the third send of a burst waits on the
// device for the next rank to free a slot, not on the host), each checked against the previous
// rank's; the last burst's blocks are received by adding them onto a buffer of ones.
void CheckPeerExchange(const std::string& name, Communicator* comm, int world_rank, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const size_t max_floats = (size_t{1} << 20) + 3;
  std::unique_ptr<cuda::PeerExchange> x = cuda::PeerExchange::Create(nc, max_floats * 4);
  c.Expect(x != nullptr, name + " PeerExchange::Create (one host)");
  if (x == nullptr) return;
  const int size = comm->size(), me = comm->rank();
  const int from = nc->members()[(me + size - 1) % size];
  const size_t sizes[] = {max_floats, 1, 4099, 77777, max_floats - 1, 256};
  const int rounds = 6;
  for (int burst : {1, 3}) {
    for (int k0 = 0; k0 < rounds; k0 += burst) {
      const int k1 = std::min(rounds, k0 + burst);
      std::vector<std::unique_ptr<DeviceBuffer<float>>> out, in;
      for (int k = k0; k < k1; ++k) {
        std::vector<float> msg(sizes[k]);
        for (size_t i = 0; i < msg.size(); ++i) msg[i] = Message(world_rank, k + 10 * burst, i);
        out.push_back(std::make_unique<DeviceBuffer<float>>(msg));
        x->Send(out.back()->get(), sizes[k] * 4, MainStream());
      }
      const bool add = burst == 3 && k1 == rounds;
      for (int k = k0; k < k1; ++k) {
        in.push_back(std::make_unique<DeviceBuffer<float>>(
            std::vector<float>(sizes[k], add ? 1.0f : -1.0f)));
        float* dst = in.back()->get();
        if (add) {
          x->Receive(
              [&](const void* inbox) {
                cuda::AddInPlace(dst, static_cast<const float*>(inbox), sizes[k], MainStream());
              },
              MainStream());
        } else {
          x->Receive(dst, sizes[k] * 4, MainStream());
        }
      }
      x->WaitSent(MainStream());
      for (int k = k0; k < k1; ++k) {
        std::vector<float> want(sizes[k]);
        for (size_t i = 0; i < want.size(); ++i)
          want[i] = Message(from, k + 10 * burst, i) + (add ? 1.0f : 0.0f);
        c.Equal(in[k - k0]->Download(sizes[k]), want,
                name + " exchange burst " + std::to_string(burst) + " round " + std::to_string(k));
      }
    }
  }
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
}

// The data-parallel gradient reduction of the bf16 model (GradReducer) between two ranks: by copy
// engine and by NCCL, all-reduce and reduce-scatter (distributed optimizer), in fp32 and in bf16
// (--grad-reduce-in-bf16), each with the buckets started as planned from the step before (two
// steps) and held back until layer 0 is done, against sums made here: every element, or with
// reduce-scatter this rank's part of each bucket, bit for bit. The first bucket spans several
// copy-engine pieces.
void CheckGradReducer(const std::string& name, Communicator* comm, Checker& c) {
  NcclCommunicator* nc = AsNccl(comm);
  const int me = comm->rank();
  const size_t big = (size_t{32} << 20) + 12347, mid = 4099, small = 77777, n = big + mid + small;
  const std::vector<DpBucket> buckets = {
      {0, big, 1, 1}, {big, mid, 0, 0}, {big + mid, small, -1, -1}};
  auto value = [](int rank, size_t i) {
    return std::ldexp(static_cast<float>((i * 2654435761u + rank * 7919u) % 1000003u), -12) -
           100.0f;
  };
  auto bf = [](float x) { return ckpt::BFloat16ToFloat(ckpt::FloatToBFloat16(x)); };
  std::vector<float> mine(n), fp32_sum(n), bf16_sum(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = value(me, i);
    const float theirs = value(1 - me, i);
    fp32_sum[i] = mine[i] + theirs;
    bf16_sum[i] = bf(bf(mine[i]) + bf(theirs));
  }
  DeviceBuffer<float> grad(n), data(n);
  DeviceBuffer<cuda::bf16> low(n);
  int checked = 0;
  for (bool copy_engine : {true, false}) {
    setenv("LEANTRON_DP_COPY_ENGINE", copy_engine ? "1" : "0", 1);
    for (bool distributed : {false, true}) {
      for (bool in_bf16 : {false, true}) {
        for (bool held_back : {false, true}) {
          const std::string what = name + (copy_engine ? " copy engine" : " NCCL") +
                                   (distributed ? " reduce-scatter" : " all-reduce") +
                                   (in_bf16 ? " in bf16" : " in fp32") +
                                   (held_back ? " held back" : " planned");
          cuda::GradReducer::Options o;
          o.overlap_grad_reduce = true;
          o.distributed = distributed;
          o.reduce_in_bf16 = in_bf16;
          if (held_back) o.start_layer = 0;
          cuda::GradReducer r(nc, grad.get(), data.get(), low.get(), buckets, o);
          c.Expect(r.transport() == std::string(copy_engine ? "copy engine" : "NCCL"),
                   what + ": reduced by " + r.transport());
          for (int step = 0; step < (held_back ? 1 : 2); ++step) {
            grad.Upload(mine);
            r.BeginBackward(true);
            r.LayerDone(1);  // the backward's layers, then the embeddings' bucket at its end
            r.LayerDone(0);
            r.BackwardDone();
            LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
            double comm_ms = 0, exposed_ms = 0;
            r.LastStep(&comm_ms, &exposed_ms);  // plans the next step's start
            // Planned from timings: any layer of the two, or none (DpReduceStartLayer's own test
            // checks the rule); held back: the fixed layer.
            c.Expect(
                held_back ? r.start_layer() == 0 : r.start_layer() >= -1 && r.start_layer() <= 1,
                what + ": start layer " + std::to_string(r.start_layer()));
            const std::vector<float> got = grad.Download(n);
            const std::vector<float>& sum = in_bf16 ? bf16_sum : fp32_sum;
            std::vector<float> g, w;
            for (const DpBucket& b : buckets) {
              const auto [first, last] =
                  distributed ? b.Part(me, 2)
                              : std::pair<size_t, size_t>{b.offset, b.offset + b.numel};
              g.insert(g.end(), got.begin() + first, got.begin() + last);
              w.insert(w.end(), sum.begin() + first, sum.begin() + last);
            }
            c.Expect(g.size() > n / 3, what + " checks its part");
            c.Equal(g, w, what + " step " + std::to_string(step));
          }
          ++checked;
        }
      }
    }
  }
  unsetenv("LEANTRON_DP_COPY_ENGINE");
  std::printf("rank %d: GradReducer: %d configurations checked\n", comm->rank(), checked);
  std::fflush(stdout);
}

struct Expected {
  std::vector<int> world, tp, dp, pp, model, embedding;
};

Expected ExpectedGroups(int rank, const ParallelSizes& s) {
  const RankCoords c = CoordsOf(rank, s);
  Expected e;
  for (int r = 0; r < s.world(); ++r) e.world.push_back(r);
  for (int t = 0; t < s.tp; ++t) e.tp.push_back(WorldRankOf({t, c.dp, c.pp}, s));
  for (int d = 0; d < s.dp; ++d) e.dp.push_back(WorldRankOf({c.tp, d, c.pp}, s));
  for (int p = 0; p < s.pp; ++p) e.pp.push_back(WorldRankOf({c.tp, c.dp, p}, s));
  for (int p = 0; p < s.pp; ++p)
    for (int t = 0; t < s.tp; ++t) e.model.push_back(WorldRankOf({t, c.dp, p}, s));
  if (s.pp > 1 && (c.pp == 0 || c.pp == s.pp - 1)) {
    e.embedding = {WorldRankOf({c.tp, c.dp, 0}, s), WorldRankOf({c.tp, c.dp, s.pp - 1}, s)};
  }
  return e;
}

int RunChecks(int rank, const ParallelSizes& sizes) {
  const LaunchInfo launch = LaunchInfoFromEnvironment();
  absl::StatusOr<ProcessGroups> groups = CreateNcclProcessGroups(launch, sizes);
  if (!groups.ok()) {
    std::fprintf(stderr, "rank %d: CreateNcclProcessGroups: %s\n", rank,
                 std::string(groups.status().message()).c_str());
    return 1;
  }
  Checker c;
  c.world_rank = rank;
  {
    ProcessGroups g = std::move(*groups);
    const Expected e = ExpectedGroups(rank, sizes);
    c.Expect(g.world_rank == rank, "world_rank");
    cudaStream_t user;
    LT_CUDA_CHECK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CheckCollectives("world", g.world.get(), e.world, rank, user, c);
    CheckCollectives("tp", g.tp.get(), e.tp, rank, user, c);
    CheckCollectives("dp", g.dp.get(), e.dp, rank, user, c);
    CheckCollectives("pp", g.pp.get(), e.pp, rank, user, c);
    CheckCollectives("model", g.model.get(), e.model, rank, user, c);
    c.Expect((g.embedding != nullptr) == !e.embedding.empty(), "embedding presence");
    if (g.embedding != nullptr && !e.embedding.empty()) {
      CheckCollectives("embedding", g.embedding.get(), e.embedding, rank, user, c);
    }
    // Pipeline neighbours (channels made at setup), and a pair made at first use.
    if (g.pp->size() > 1) CheckRing("pp", g.pp.get(), rank, user, c);
    if (g.tp->size() == 2) CheckRing("tp", g.tp.get(), rank, user, c);
    if (g.tp->size() > 1) CheckPeerExchange("tp", g.tp.get(), rank, c);
    if (g.world->size() > 1) CheckPeerExchange("world", g.world.get(), rank, c);
    if (g.dp->size() == 2) CheckGradReducer("dp", g.dp.get(), c);
    g.world->Barrier();
    LT_CUDA_CHECK(cudaStreamSynchronize(user));
    LT_CUDA_CHECK(cudaStreamDestroy(user));
  }  // destroying the groups: every rank says goodbye, rank 0 last
  if (c.failures == 0) std::fprintf(stderr, "rank %d: all checks passed\n", rank);
  return c.failures == 0 ? 0 : 1;
}

std::string Describe(const ParallelSizes& s) {
  return "tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) +
         " dp=" + std::to_string(s.dp);
}

TEST(NcclComm, CollectivesAndPointToPoint) {
  const int gpus = DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const int n = std::min(gpus, 4);
  std::vector<ParallelSizes> configs;
  for (int tp : {2, 1}) {
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp) == 0) configs.push_back({tp, pp, n / (tp * pp)});
    }
  }
  for (const ParallelSizes& sizes : configs) {
    SCOPED_TRACE(Describe(sizes));
    const std::string dir = TempDir();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Child> children =
        LaunchRanks(n, FreePort(), dir, [&](int rank) { return RunChecks(rank, sizes); });
    WaitAll(children, 120);
    std::printf("[ %s ] %d ranks: %.1f s\n", Describe(sizes).c_str(), n,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (const Child& c : children) {
      EXPECT_TRUE(c.exited && c.code == 0)
          << "rank " << c.rank << (c.exited ? " exited with " : " died of signal ") << c.code
          << " after " << c.seconds << " s; its stderr:\n"
          << ReadFile(c.log);
    }
  }
}

// `victim` exits right after the groups are built while the others enter an AllReduce: they must
// stop on their own (no launcher kills them here), non-zero, with the watchdog's message.
void DeadRank(int victim) {
  const int gpus = DeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpus;
  const int n = std::min(gpus, 4);
  const ParallelSizes sizes{1, 1, n};
  const std::string dir = TempDir();
  std::vector<Child> children = LaunchRanks(n, FreePort(), dir, [&](int rank) {
    absl::StatusOr<ProcessGroups> groups =
        CreateNcclProcessGroups(LaunchInfoFromEnvironment(), sizes);
    if (!groups.ok()) {
      std::fprintf(stderr, "rank %d: CreateNcclProcessGroups: %s\n", rank,
                   std::string(groups.status().message()).c_str());
      return 2;
    }
    ProcessGroups g = std::move(*groups);
    const size_t count = size_t{1} << 22;
    DeviceBuffer<float> d(count);
    g.world->Barrier();
    if (rank == victim) _exit(9);
    g.world->AllReduceSum(d.get(), count);
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    std::fprintf(stderr, "rank %d: the AllReduce returned without rank %d\n", rank, victim);
    return 0;
  });
  WaitAll(children, 120);
  for (const Child& c : children) {
    const std::string log = ReadFile(c.log);
    if (c.rank == victim) {
      EXPECT_TRUE(c.exited && c.code == 9) << "victim: " << c.code << "\n" << log;
      continue;
    }
    EXPECT_TRUE(c.exited && c.code != 0)
        << "rank " << c.rank << (c.exited ? " exited with " : " killed (hung) or died of signal ")
        << c.code << " after " << c.seconds << " s; its stderr:\n"
        << log;
    const std::string prefix = "leantron: rank " + std::to_string(c.rank) + " ";
    EXPECT_NE(log.find(prefix), std::string::npos) << "rank " << c.rank << ":\n" << log;
    EXPECT_NE(log.find("; exiting"), std::string::npos) << "rank " << c.rank << ":\n" << log;
    const size_t at = log.find(prefix);
    const std::string line =
        at == std::string::npos ? "(no message)" : log.substr(at, log.find('\n', at) - at);
    std::printf("rank %d: exit %d after %.1f s: %s\n", c.rank, c.code, c.seconds, line.c_str());
  }
}

TEST(NcclComm, DeadRankStopsTheOthers) { DeadRank(1); }

// Rank 0 serves the store: its death shows as a store that stops answering.
TEST(NcclComm, DeadStoreStopsTheOthers) { DeadRank(0); }

}  // namespace
}  // namespace leantron::trainer
