// The harness of the NCCL tests (gpu_nccl_test): ranks as forked child processes with a
// launcher's environment (forked before the parent touches CUDA), and on the child side exact test
// values, device buffers in stream order and a checker that counts failures. The checks of one
// subject each live in their own file and run inside RunChecks' ranks (nccl_groups_test.cc), so
// one rendezvous serves them all.
#pragma once

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
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/parallel/grad_reduce.h"
#include "trainer/cuda/parallel/peer_exchange.h"
#include "trainer/dist/comm_gloo.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::nccl_test {

using cuda::MainStream;

// ---- parent side: ranks as child processes ---------------------------------------------------

// Counted in a child: a process that has initialised CUDA must not fork ranks that use it.
inline int DeviceCount() {
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

inline int FreePort() {
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

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Forks `n` ranks running body(rank) with a launcher's environment; each one's stderr goes to
// <dir>/rank<r>.log.
inline std::vector<Child> LaunchRanks(int n, int port, const std::string& dir,
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
inline void WaitAll(std::vector<Child>& children, double limit_s) {
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

inline std::string TempDir() {
  char tmpl[] = "/tmp/nccl_comm_test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d != nullptr ? d : "/tmp";
}

// ---- child side ------------------------------------------------------------------------------

// Small integers: every sum below is exact in float (and in bf16), whatever NCCL's order.
inline float Value(int world_rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + world_rank * 13) % 31) - 15);
}
inline float SmallValue(int world_rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 5 + world_rank * 3) % 9) - 4);
}
// Exact for the small integers above (their low 16 bits are zero).
inline uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
inline float FromBf16(uint16_t b) {
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

inline std::vector<float> Fill(int world_rank, size_t n, float (*f)(int, size_t)) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = f(world_rank, i);
  return v;
}

inline std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16(v[i]);
  return out;
}

inline std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FromBf16(v[i]);
  return out;
}

// Message k of `sender` in the point-to-point checks.
inline float Message(int sender, int k, size_t i) {
  return static_cast<float>(sender * 1000 + k * 100 + static_cast<int>(i % 97));
}

// The checks (one file each), run by every rank of a group.
void CheckCollectives(const std::string& name, Communicator* comm, const std::vector<int>& members,
                      int world_rank, cudaStream_t user, Checker& c);
void CheckRing(const std::string& name, Communicator* comm, int world_rank, cudaStream_t user,
               Checker& c);
void CheckPeerExchange(const std::string& name, Communicator* comm, int world_rank, Checker& c);
void CheckGradReducer(const std::string& name, Communicator* comm, Checker& c);
void CheckShardedGradReducer(const std::string& name, Communicator* comm, Checker& c);

}  // namespace leantron::trainer::nccl_test
