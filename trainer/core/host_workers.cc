#include "trainer/core/host_workers.h"

#include <algorithm>

namespace leantron::trainer {

HostWorkers::HostWorkers(int threads) {
  for (int i = 1; i < threads; ++i) pool_.emplace_back([this] { Work(); });
}

HostWorkers::~HostWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : pool_) t.join();
}

bool HostWorkers::RunPieces() {
  bool last = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (body_ != nullptr && next_ < n_) {
    const size_t begin = next_, end = std::min(n_, begin + grain_);
    next_ = end;
    const auto* body = body_;
    lock.unlock();
    (*body)(begin, end);
    lock.lock();
    if (++finished_ == pieces_) last = true;
  }
  return last;
}

void HostWorkers::Work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    if (RunPieces()) done_.notify_all();
  }
}

void HostWorkers::ParallelFor(size_t n, size_t grain,
                              const std::function<void(size_t, size_t)>& body) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    n_ = n;
    grain_ = grain;
    next_ = 0;
    finished_ = 0;
    pieces_ = (n + grain - 1) / grain;
    ++generation_;
  }
  wake_.notify_all();
  RunPieces();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == pieces_; });
  body_ = nullptr;
}

}  // namespace leantron::trainer
