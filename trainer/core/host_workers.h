// A fixed set of host threads that run the pieces of a loop together (the offloaded optimizer's
// step over pinned host memory): ParallelFor hands out contiguous pieces and returns when every
// piece has run. One loop at a time; the calling thread works on pieces too.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace leantron::trainer {

class HostWorkers {
 public:
  // `threads` in all, the caller included (at least 1).
  explicit HostWorkers(int threads);
  ~HostWorkers();
  HostWorkers(const HostWorkers&) = delete;
  HostWorkers& operator=(const HostWorkers&) = delete;

  int threads() const { return static_cast<int>(pool_.size()) + 1; }
  // body(begin, end) over [0, n) in pieces of `grain` elements (the last may be shorter), each
  // piece exactly once.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& body);

 private:
  void Work();
  bool RunPieces();  // takes pieces until none is left; true when it ran the last one

  std::vector<std::thread> pool_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t, size_t)>* body_ = nullptr;
  size_t n_ = 0, grain_ = 1, next_ = 0, finished_ = 0, pieces_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace leantron::trainer
